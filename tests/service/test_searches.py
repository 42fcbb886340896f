"""The trials table is the one record of a job's search: searches are rebuilt from it, asks are idempotent.

Through the real app on SQLite and PostgreSQL; "a restart" is a second app over the same database
(nothing in memory), "another replica" a second app writing while the first keeps its search.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import text

from tests.credentials import ADMIN, ADMIN_SECRET
from tiletune.service.app import create_app
from tiletune.service.database import make_engine
from tiletune.service.migrate import upgrade
from tiletune.service.settings import Settings

from .conftest import ManualClock, postgres_database
from .test_protocol import (
    LEASE_S,
    ask,
    held,
    lease,
    measurement,
    register,
    submit,
    synthetic_ms,
    tell,
    work_job,
)


@contextmanager
def server(database_url: str, clock: ManualClock) -> Iterator[TestClient]:
    """One replica (or one life of a restarted server) over ``database_url``."""
    settings = Settings(db_url=database_url, lease_s=LEASE_S, max_lease_failures=3, admin_token=ADMIN_SECRET)
    with TestClient(create_app(settings, clock=clock, reaper=False), headers=ADMIN) as client:
        yield client


def trial_rows(database_url: str, job_id: int) -> list[tuple[Any, ...]]:
    engine = make_engine(database_url)
    try:
        with engine.connect() as connection:
            query = (
                "SELECT number, state FROM trials WHERE job_id = :job AND phase = 'search' ORDER BY number"
            )
            return [tuple(row) for row in connection.execute(text(query), {"job": job_id})]
    finally:
        engine.dispose()


def test_asking_again_after_a_lost_answer_returns_the_same_trials_first(
    database_url: str, clock: ManualClock
) -> None:
    upgrade(database_url)
    with server(database_url, clock) as client:
        register(client)
        job_id = submit(client, trials=8)["jobs"][0]["id"]
        leased = lease(client, 1)
        assert leased is not None
        token = leased["token"]
        lost = ask(client, token, 2)["tasks"]  # the answer never reaches the worker
        again = ask(client, token, 3)["tasks"]
        assert again[:2] == lost
        assert len(again) == 3
        # a worker that says what it holds gets new trials, never its own again
        ahead = client.post(
            "/v1/lease/ask", headers=held(token), params={"n": 2, "holding": [t["trial_id"] for t in again]}
        ).json()["tasks"]
        assert {t["trial_id"] for t in ahead}.isdisjoint({t["trial_id"] for t in again})
        tell(client, token, again + ahead)
        job = work_job(client, token)
    assert job["state"] == "done"
    states = [state for _, state in trial_rows(database_url, job_id)]
    assert states.count("measured") == job["progress"]["completed"] == 8
    assert "asked" not in states


def test_a_restarted_server_rebuilds_the_search_from_the_trials(
    database_url: str, clock: ManualClock
) -> None:
    upgrade(database_url)
    with server(database_url, clock) as first:
        register(first)
        job_id = submit(first, trials=10)["jobs"][0]["id"]
        leased = lease(first, 1)
        assert leased is not None
        token = leased["token"]
        tell(first, token, ask(first, token, 4)["tasks"])
        held = ask(first, token, 2)["tasks"]
    with server(database_url, clock) as second:  # a restart: nothing in memory
        again = ask(second, token, 2)["tasks"]
        assert again == held  # outstanding under the live lease: still the lease's
        tell(second, token, again)
        job = work_job(second, token)
    assert job["state"] == "done"
    numbers = [number for number, _ in trial_rows(database_url, job_id)]
    assert numbers == sorted(set(numbers)), "trial numbers never repeat across the restart"
    assert job["progress"]["completed"] == 10


def test_trials_asked_under_a_lease_that_is_over_are_not_held(database_url: str, clock: ManualClock) -> None:
    """A crash between the reaper's commit and the abandon step leaves trials ``asked`` under an
    ended lease; the next use of the job abandons them instead of answering ``wait`` forever."""
    upgrade(database_url)
    with server(database_url, clock) as first:
        register(first)
        job_id = submit(first, trials=3)["jobs"][0]["id"]
        leased = lease(first, 1)
        assert leased is not None
        asked = ask(first, leased["token"], 3)["tasks"]
    engine = make_engine(database_url)  # the reaper's commit, without its abandon step
    with engine.begin() as connection:
        connection.execute(text("UPDATE leases SET ended_at = expires_at, end_reason = 'expired'"))
        connection.execute(text("UPDATE jobs SET active_leases = 0, state = 'queued', lease_failures = 1"))
    engine.dispose()
    with server(database_url, clock) as second:
        again = lease(second, 1)
        assert again is not None
        answer = ask(second, again["token"], 3)
        assert answer["phase"] == "search"
        assert sorted(t["trial_id"] for t in answer["tasks"]) != sorted(t["trial_id"] for t in asked)
        assert {str(t["config"]) for t in answer["tasks"]} == {str(t["config"]) for t in asked}
        tell(second, again["token"], answer["tasks"])
        job = work_job(second, again["token"])
    assert job["state"] == "done"
    assert job["progress"]["completed"] == 3
    assert [s for _, s in trial_rows(database_url, job_id)].count("abandoned") == 3


def test_a_replica_sees_trials_another_replica_wrote(clock: ManualClock) -> None:
    with postgres_database() as postgres_url:
        upgrade(postgres_url)
        _two_replicas_share_a_job(postgres_url, clock)


def _two_replicas_share_a_job(postgres_url: str, clock: ManualClock) -> None:
    with server(postgres_url, clock) as one, server(postgres_url, clock) as other:
        register(one)
        job_id = submit(one, trials=12, workers_per_job=2)["jobs"][0]["id"]
        first, second = lease(one, 1), lease(one, 1)
        assert first is not None
        assert second is not None
        tell(one, first["token"], ask(one, first["token"], 3)["tasks"])  # one builds its search
        tell(other, second["token"], ask(other, second["token"], 3)["tasks"])  # other writes
        more = ask(one, first["token"], 3)["tasks"]  # one must rebuild: other's trials are taken
        tell(one, first["token"], more)
        job = work_job(one, first["token"], batch=3)
    configs = [str(c) for c in _configs(postgres_url, job_id)]
    assert len(configs) == len(set(configs)), "no config is measured twice"
    assert job["progress"]["completed"] == 12


def test_a_failed_transaction_leaves_no_trace_in_the_search(database_url: str, clock: ManualClock) -> None:
    upgrade(database_url)
    with server(database_url, clock) as client:
        register(client)
        submit(client, trials=4)
        leased = lease(client, 1)
        assert leased is not None
        token = leased["token"]
        tasks = ask(client, token, 2)["tasks"]
        bad = [{"trial_id": tasks[0]["trial_id"], "measurement": measurement(1.0)}, {"trial_id": 999}]
        refused = client.post("/v1/lease/tell", headers=held(token), json={"outcomes": bad})
        assert refused.status_code == 422
        told = tell(client, token, tasks)  # the first outcome was rolled back with the refusal
        assert told == {"accepted": 2, "repeated": 0}
        job = work_job(client, token)
    assert job["progress"]["completed"] == 4
    assert job["progress"]["best_ms"] == min(synthetic_ms(c) for c in _configs(database_url, job["id"]))


def _configs(database_url: str, job_id: int) -> list[dict[str, int]]:
    engine = make_engine(database_url)
    try:
        with engine.connect() as connection:
            query = (
                "SELECT config FROM trials WHERE job_id = :job AND state = 'measured' AND phase = 'search'"
            )
            rows = connection.execute(text(query), {"job": job_id}).scalars().all()
    finally:
        engine.dispose()
    return [row if isinstance(row, dict) else json.loads(row) for row in rows]
