"""One live job per key, held by the database; ``Idempotency-Key`` on ``POST /v1/sweeps``; revision
0013 over a store holding duplicate live jobs. On SQLite and PostgreSQL; the concurrent sweeps go
to a real server process."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import MetaData, Table, insert, select, update
from sqlalchemy.exc import IntegrityError

from tests.credentials import ADMIN, ADMIN_SECRET
from tests.service.processes import start_server, stop
from tiletune.service.app import create_app
from tiletune.service.database import make_engine
from tiletune.service.migrate import downgrade, drift, upgrade
from tiletune.service.models import LIVE_KEY_INDEX
from tiletune.service.settings import Settings

SWEEP = {"kernel": "add", "shapes": [{"n": 4096}], "dtypes": ["float32", "float16"]}
SENDERS = 20
NOW = datetime(2026, 12, 7, tzinfo=UTC)


@pytest.fixture
def app(database_url: str) -> Iterator[TestClient]:
    upgrade(database_url)
    settings = Settings(db_url=database_url, admin_token=ADMIN_SECRET)
    with TestClient(create_app(settings, reaper=False), headers=ADMIN) as client:
        yield client


def submit(app: TestClient, document: dict[str, Any], key: str | None = None) -> httpx.Response:
    response: httpx.Response = app.post(
        "/v1/sweeps", json=document, headers={} if key is None else {"Idempotency-Key": key}
    )
    return response


def test_concurrent_identical_sweeps_make_one_live_job_per_key(database_url: str, tmp_path: Path) -> None:
    server = start_server(tmp_path, db_url=database_url)
    try:
        with httpx.Client(base_url=server.url, headers=ADMIN, timeout=60) as http:

            def send(_: int) -> httpx.Response:
                return http.post("/v1/sweeps", json=SWEEP)

            with ThreadPoolExecutor(SENDERS) as pool:
                answers = list(pool.map(send, range(SENDERS)))
            assert [answer.status_code for answer in answers] == [201] * SENDERS
            jobs = http.get("/v1/jobs", params={"limit": 1000}).json()
    finally:
        stop(server.process)
    assert len(jobs) == SENDERS * 2
    for dtype in ("float32", "float16"):
        of_key = [job for job in jobs if job["dtype"] == dtype]
        live = [job for job in of_key if job["state"] == "queued"]
        assert len(live) == 1, of_key
        skipped = [job for job in of_key if job["state"] == "skipped"]
        assert len(skipped) == SENDERS - 1
        assert {job["tuned_by"] for job in skipped} == {live[0]["id"]}
        assert live[0]["tuned_by"] is None


def test_a_key_whose_job_ended_gets_a_live_job_again(app: TestClient) -> None:
    first = submit(app, SWEEP).json()
    assert submit(app, SWEEP).json()["counts"] == {"skipped": 2}
    assert app.post(f"/v1/sweeps/{first['id']}/cancel").status_code == 200
    again = submit(app, SWEEP).json()
    assert again["counts"] == {"queued": 2}


def test_forcing_does_not_make_a_second_live_job(app: TestClient) -> None:
    first = submit(app, SWEEP).json()
    forced = submit(app, {**SWEEP, "force": True}).json()
    assert forced["counts"] == {"skipped": 2}
    assert {job["tuned_by"] for job in forced["jobs"]} == {job["id"] for job in first["jobs"]}


def test_the_database_refuses_a_second_live_job_of_a_key(database_url: str, app: TestClient) -> None:
    submit(app, SWEEP)
    engine = make_engine(database_url)
    try:
        jobs = Table("jobs", MetaData(), autoload_with=engine)
        with engine.begin() as connection:
            row = dict(connection.execute(select(jobs).limit(1)).mappings().one())
        refused = f"{LIVE_KEY_INDEX}|UNIQUE constraint failed: jobs.kernel"  # PostgreSQL's | SQLite's
        with pytest.raises(IntegrityError, match=refused), engine.begin() as connection:
            connection.execute(insert(jobs).values({**row, "id": row["id"] + 1000}))
        with engine.begin() as connection:  # a finished job of the key is no live job
            connection.execute(insert(jobs).values({**row, "id": row["id"] + 1000, "state": "done"}))
    finally:
        engine.dispose()


def test_an_idempotency_key_answers_its_first_sweep(app: TestClient) -> None:
    first = submit(app, SWEEP, key="deploy-42")
    again = submit(app, SWEEP, key="deploy-42")
    assert (first.status_code, again.status_code) == (201, 201)
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["jobs"] == first.json()["jobs"]
    assert len(app.get("/v1/sweeps").json()) == 1
    other = submit(app, {**SWEEP, "trials": 7}, key="deploy-42")
    assert other.status_code == 409
    assert other.json()["field"] == "Idempotency-Key"
    assert f"sweep {first.json()['id']}" in other.json()["message"]
    assert len(app.get("/v1/sweeps").json()) == 1  # nothing written


def test_an_idempotency_key_is_bounded_and_named_when_bad(app: TestClient) -> None:
    for bad in ("x" * 201, "two words"):
        answer = submit(app, SWEEP, key=bad)
        assert answer.status_code == 422
        assert "Idempotency-Key" in answer.text
    assert app.get("/v1/sweeps").json() == []


def test_idempotency_keys_are_each_tokens_own(app: TestClient) -> None:
    made = app.post("/v1/tokens", json={"name": "ci", "role": "submitter"})
    assert made.status_code == 201, made.text
    other = {"Authorization": f"Bearer {made.json()['token']}", "Idempotency-Key": "same"}
    mine = submit(app, SWEEP, key="same").json()
    theirs = app.post("/v1/sweeps", json=SWEEP, headers=other)
    assert theirs.status_code == 201
    assert theirs.json()["id"] != mine["id"]


def _job(job_id: int, state: str, dtype: str = "float32") -> dict[str, Any]:
    return {
        "id": job_id, "sweep_id": 1, "kernel": "add", "kernel_version": 1, "shape": {"n": 4096},
        "shape_key": "n=4096", "dtype": dtype, "chip_target": "*", "backend": None, "strategy": "tpe",
        "trials": 4, "seed": 0, "workers_per_job": 1, "validate_top": 3, "force": False,
        "state": state, "active_leases": 0, "lease_failures": 0, "failure_reasons": ["earlier"],
        "completed": 0, "invalid": 0, "failed": 0, "created_at": NOW, "updated_at": NOW,
    }  # fmt: skip


def test_the_upgrade_keeps_each_keys_oldest_live_job(database_url: str) -> None:
    upgrade(database_url, "0012")
    engine = make_engine(database_url)
    try:
        meta = MetaData()
        sweeps, jobs = (Table(name, meta, autoload_with=engine) for name in ("sweeps", "jobs"))
        with engine.begin() as connection:
            connection.execute(insert(sweeps).values(id=1, kernels=["add"], request=SWEEP, created_at=NOW))
            connection.execute(
                insert(jobs),
                [
                    _job(1, "done"),  # finished: no live job
                    _job(2, "running"),  # the key's oldest live job: kept
                    _job(3, "queued"),  # a duplicate: cancelled
                    _job(4, "queued"),  # a duplicate: cancelled
                    _job(5, "queued", dtype="float16"),  # another key: kept
                ],
            )
        upgrade(database_url)
        assert drift(database_url) == []
        with engine.begin() as connection:
            rows = (
                connection.execute(select(Table("jobs", MetaData(), autoload_with=connection)).order_by("id"))
                .mappings()
                .all()
            )
        states = [(row["id"], row["state"], row["tuned_by_job_id"]) for row in rows]
        assert states == [(1, "done", None), (2, "running", None), (3, "cancelled", 2), (4, "cancelled", 2),
                          (5, "queued", None)]  # fmt: skip
        cancelled = rows[2]
        assert cancelled["failure_reasons"][0] == "earlier"
        assert "one live job per key" in cancelled["failure_reasons"][-1]
        assert cancelled["finished_at"] is not None
        downgrade(database_url, "0012")
        with engine.begin() as connection:  # the previous release's schema: no index, no columns
            connection.execute(update(jobs).where(jobs.c.id == 3).values(state="queued"))
            connection.execute(update(jobs).where(jobs.c.id == 4).values(state="queued"))
        upgrade(database_url)
    finally:
        engine.dispose()
