"""The job lifecycle: one transition table, and the only code that assigns a job's state.

A job is born ``queued``, or ``skipped`` when its key is already tuned on the chip's current
software (:func:`born`). After that its state changes only by an :class:`Event` that
:data:`TRANSITIONS` allows from the state it is in, through :func:`move` (or, for the
queue's compare-and-set claim, the state :func:`target` names); every other module asks
this one. A transition that the table does not allow is a bug, raised as
:class:`IllegalTransitionError`.

::

    queued ──claimed──► running ──search_done──► validating ──validated──► done
      │  ▲                 │  ▲                      │
      │  └──leases_ended───┘  └────validator_left────┘
      ├──already_tuned──► skipped
      └── (queued, running, validating) ──too_many_failures──► failed
                                        ──cancelled──────────► cancelled

The states are the wire's :class:`~tiletune.client.wire.JobState`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Protocol

from tiletune.client.wire import FINAL_JOB_STATES, LIVE_JOB_STATES, JobState


class Event(StrEnum):
    """What happens to a job."""

    CLAIMED = "claimed"
    ALREADY_TUNED = "already_tuned"
    SEARCH_DONE = "search_done"
    VALIDATED = "validated"
    VALIDATOR_LEFT = "validator_left"
    LEASES_ENDED = "leases_ended"
    TOO_MANY_FAILURES = "too_many_failures"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class Transition:
    """Where an event takes a job, and why it happens."""

    to: JobState
    reason: str


_LIVE = LIVE_JOB_STATES

#: (state, event) -> transition. The only place that says which state follows which.
TRANSITIONS: dict[tuple[JobState, Event], Transition] = {
    (JobState.QUEUED, Event.CLAIMED): Transition(JobState.RUNNING, "a worker of its chip leased it"),
    (JobState.RUNNING, Event.CLAIMED): Transition(
        JobState.RUNNING, "another worker of its chip joined (workers_per_job)"
    ),
    (JobState.QUEUED, Event.ALREADY_TUNED): Transition(
        JobState.SKIPPED, "the leasing chip tuned its key on the same software already"
    ),
    (JobState.RUNNING, Event.SEARCH_DONE): Transition(
        JobState.VALIDATING, "the search has nothing left to ask; one lease re-measures the finalists"
    ),
    (JobState.VALIDATING, Event.CLAIMED): Transition(
        JobState.VALIDATING, "a worker of its chip other than its leader leased it to confirm the pick"
    ),
    (JobState.VALIDATING, Event.VALIDATED): Transition(
        JobState.DONE, "the interleaved validation run came back; its winner was promoted if it won"
    ),
    (JobState.VALIDATING, Event.VALIDATOR_LEFT): Transition(
        JobState.RUNNING, "the validating lease ended without completing; another lease validates"
    ),
    (JobState.RUNNING, Event.LEASES_ENDED): Transition(
        JobState.QUEUED, "no lease holds it any more; it waits for a worker"
    ),
    **{
        (state, Event.TOO_MANY_FAILURES): Transition(
            JobState.FAILED, "max_lease_failures of its leases failed or expired"
        )
        for state in _LIVE
    },
    **{(state, Event.CANCELLED): Transition(JobState.CANCELLED, "cancelled on request") for state in _LIVE},
}


class HasState(Protocol):
    """A job row as the lifecycle sees it."""

    state: str
    updated_at: datetime
    finished_at: datetime | None


class IllegalTransitionError(RuntimeError):
    """An event the table does not allow in the job's state (a bug, not bad input)."""


def born(already_tuned: bool) -> JobState:
    """The state a new job starts in."""
    return JobState.SKIPPED if already_tuned else JobState.QUEUED


def is_live(state: str) -> bool:
    """True while a job still has work to do."""
    return state in LIVE_JOB_STATES


def is_final(state: str) -> bool:
    """True once a job is done, failed, cancelled or skipped."""
    return state in FINAL_JOB_STATES


def allows(state: str, event: Event) -> bool:
    """True when ``event`` may happen to a job in ``state``."""
    return (JobState(state), event) in TRANSITIONS


def target(state: str, event: Event) -> JobState:
    """The state ``event`` takes a job in ``state`` to; :class:`IllegalTransitionError` if none."""
    found = TRANSITIONS.get((JobState(state), event))
    if found is None:
        raise IllegalTransitionError(f"a job in state {str(state)!r} cannot be {event.value!r}")
    return found.to


def move(job: HasState, event: Event, now: datetime) -> JobState:
    """Apply ``event`` to ``job``: its new state, ``updated_at`` and, once final, ``finished_at``."""
    state = target(job.state, event)
    job.state = state
    job.updated_at = now
    if is_final(state):
        job.finished_at = now
    return state
