"""The job lifecycle's table, and the database's generation moving only after a commit."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tiletune.client.wire import FINAL_JOB_STATES, JobState
from tiletune.service.database import Database, configs_changed, make_engine, make_sessions
from tiletune.service.scheduling import lifecycle
from tiletune.service.scheduling.lifecycle import Event, IllegalTransitionError

NOW = datetime(2026, 12, 1, tzinfo=UTC)


@dataclass
class Job:
    state: str
    updated_at: datetime = datetime(2026, 1, 1, tzinfo=UTC)
    finished_at: datetime | None = None


def test_a_job_runs_validates_and_ends_done() -> None:
    job = Job(lifecycle.born(already_tuned=False))
    for event in (Event.CLAIMED, Event.SEARCH_DONE, Event.VALIDATED):
        lifecycle.move(job, event, NOW)

    assert job.state == JobState.DONE
    assert job.finished_at == NOW


def test_a_key_tuned_already_is_born_skipped_and_final() -> None:
    assert lifecycle.born(already_tuned=True) == JobState.SKIPPED
    assert lifecycle.is_final(JobState.SKIPPED)


@pytest.mark.parametrize("state", FINAL_JOB_STATES)
def test_nothing_moves_a_finished_job(state: JobState) -> None:
    job = Job(state)
    for event in Event:
        assert not lifecycle.allows(state, event)
        with pytest.raises(IllegalTransitionError, match=f"state {state.value!r}"):
            lifecycle.move(job, event, NOW)
    assert job.state == state


def test_a_validating_job_whose_validator_left_runs_again_and_requeues_when_no_lease_is_left() -> None:
    job = Job(JobState.VALIDATING)
    lifecycle.move(job, Event.VALIDATOR_LEFT, NOW)
    lifecycle.move(job, Event.LEASES_ENDED, NOW)

    assert job.state == JobState.QUEUED
    assert job.finished_at is None


def test_every_transition_says_why() -> None:
    assert all(transition.reason for transition in lifecycle.TRANSITIONS.values())
    assert {state for state, _ in lifecycle.TRANSITIONS} <= {
        JobState.QUEUED,
        JobState.RUNNING,
        JobState.VALIDATING,
    }


def test_the_generation_moves_after_a_commit_that_changed_configs_only(tmp_path: Path) -> None:
    db = Database(make_sessions(make_engine(f"sqlite:///{tmp_path / 'g.db'}")))
    with db.write() as session:
        configs_changed(session)
        assert db.generation == 0  # not before the commit: a reader would cache old rows under it
    assert db.generation == 1

    def change_then_fail() -> None:
        with db.write() as session:
            configs_changed(session)
            raise RuntimeError("rolled back")

    with db.write():
        pass
    with pytest.raises(RuntimeError):
        change_then_fail()
    assert db.generation == 1
