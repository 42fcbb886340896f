"""The conditions of each measurement, on SQLite and PostgreSQL: a real CPU worker's trials store
its governor and load, the trials API and the job page return them; a worker of an earlier release
that sends none keeps working; bad conditions are refused naming the field; revision 0011 adds and
drops ``trials.conditions`` under stored trials."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import MetaData, Table, inspect, select

from tests.credentials import ADMIN, ADMIN_SECRET
from tiletune.client.wire import TrialPublic
from tiletune.kernels.conditions import read_governor
from tiletune.service.app import create_app
from tiletune.service.database import make_engine
from tiletune.service.migrate import current_revision, downgrade, drift, upgrade
from tiletune.service.settings import Settings
from tiletune.tuner.measure.bench import BenchSettings
from tiletune.tuner.measure.worker import Worker

from .test_protocol import held, lease, measurement, register, submit

QUICK = BenchSettings(warmup_runs=1, min_samples=3, max_samples=5, budget_s=0.01)
SWEEP = {"kernel": "add", "shapes": [{"n": 4096}], "dtypes": ["float32"], "trials": 4}


def app_client(url: str) -> TestClient:
    settings = Settings(db_url=url, admin_token=ADMIN_SECRET)
    return TestClient(create_app(settings, reaper=False), headers=ADMIN)


@pytest.fixture
def client(database_url: str) -> Iterator[TestClient]:
    upgrade(database_url)
    with app_client(database_url) as test_client:
        yield test_client


def tune_with_a_worker(client: TestClient) -> list[dict[str, Any]]:
    """One job tuned by a real CPU worker; its trials as the trials API returns them."""
    assert client.post("/v1/sweeps", json=SWEEP).status_code == 201
    assert Worker(client, backend="cpu", bench=QUICK, batch=2, name="measuring").run(once=True) == 1
    job = client.get("/v1/jobs").json()[0]
    assert job["state"] == "done", job
    trials: list[dict[str, Any]] = client.get(f"/v1/jobs/{job['id']}/trials").json()
    return trials


def test_a_workers_trials_store_its_governor_and_load(client: TestClient) -> None:
    trials = tune_with_a_worker(client)
    measured = [t for t in trials if t["state"] in ("measured", "validated")]
    assert {t["phase"] for t in measured} == {"search", "validate"}
    governor = read_governor(cpus=os.sched_getaffinity(0))  # None in containers without cpufreq
    for trial in measured:
        conditions = trial["conditions"]
        assert conditions["device_kind"] == "cpu"
        assert "governor" in conditions
        assert conditions["governor"] == governor
        assert conditions["load_1m"] >= 0
        assert conditions["load_5m"] >= 0
        assert conditions["clock_fraction"] is None
        assert conditions["low_clock"] is False
        assert TrialPublic.model_validate(trial).conditions is not None


def test_the_job_page_shows_each_trials_conditions(client: TestClient) -> None:
    tune_with_a_worker(client)
    job_id = client.get("/v1/jobs").json()[0]["id"]
    page = client.get(f"/jobs/{job_id}")
    assert page.status_code == 200
    assert "Conditions" in page.text
    assert " · load " in page.text
    rows = client.get(f"/jobs/{job_id}", params={"format": "json", "table": "trials"}).json()
    shown = [row["conditions"] for row in rows if row["state"] in ("measured", "validated")]
    assert shown
    assert all(text.startswith(("governor unknown · load ", f"{read_governor()} · load ")) for text in shown)


def test_a_worker_that_sends_no_conditions_keeps_working(client: TestClient) -> None:
    worker_id = register(client)
    submit(client, trials=2)
    leased = lease(client, worker_id)
    assert leased is not None
    token = leased["token"]
    tasks = client.post("/v1/lease/ask", headers=held(token), params={"n": 1}).json()["tasks"]
    outcome = {"trial_id": tasks[0]["trial_id"], "measurement": measurement(1.0)}
    told = client.post("/v1/lease/tell", headers=held(token), json={"outcomes": [outcome]})
    assert told.status_code == 200, told.text
    trials = client.get(f"/v1/jobs/{leased['job']['id']}/trials").json()
    stored = next(t for t in trials if t["number"] == tasks[0]["trial_id"])
    assert stored["state"] == "measured"
    assert stored["conditions"] is None


@pytest.mark.parametrize(
    ("conditions", "field"),
    [
        ({"device_kind": "cpu", "load_1m": -1.0}, "load_1m"),
        ({"device_kind": "cpu", "governor": "performance\u202e"}, "governor"),
        ({"device_kind": "tpu"}, "device_kind"),
        ({"device_kind": "cuda", "temperature_c": 1e9}, "temperature_c"),
        ({"device_kind": "cpu", "fan_rpm": 3000}, "fan_rpm"),
    ],
)
def test_bad_conditions_are_refused_naming_the_field(
    client: TestClient, conditions: dict[str, Any], field: str
) -> None:
    worker_id = register(client)
    submit(client, trials=2)
    leased = lease(client, worker_id)
    assert leased is not None
    token = leased["token"]
    task = client.post("/v1/lease/ask", headers=held(token), params={"n": 1}).json()["tasks"][0]
    outcome = {"trial_id": task["trial_id"], "measurement": {**measurement(1.0), "conditions": conditions}}
    refused = client.post("/v1/lease/tell", headers=held(token), json={"outcomes": [outcome]})
    assert refused.status_code == 422, refused.text
    assert refused.json()["field"] == f"outcomes[0].measurement.conditions.{field}"
    trials = client.get(f"/v1/jobs/{leased['job']['id']}/trials").json()
    assert all(t["state"] == "asked" for t in trials), "a refused tell changes nothing"


def _trial_columns(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return {column["name"] for column in inspect(engine).get_columns("trials")}
    finally:
        engine.dispose()


def _stored_conditions(url: str) -> list[Any]:
    engine = make_engine(url)
    try:
        trials = Table("trials", MetaData(), autoload_with=engine)
        with engine.connect() as connection:
            return list(connection.scalars(select(trials.c.conditions).order_by(trials.c.id)))
    finally:
        engine.dispose()


def test_revision_0011_adds_and_drops_the_column_under_stored_trials(database_url: str) -> None:
    upgrade(database_url)
    with app_client(database_url) as client:
        count = len(tune_with_a_worker(client))
    assert any(stored is not None for stored in _stored_conditions(database_url))

    downgrade(database_url, "0010")
    assert current_revision(database_url) == "0010"
    assert "conditions" not in _trial_columns(database_url)

    upgrade(database_url, "0011")
    assert "conditions" in _trial_columns(database_url)
    assert _stored_conditions(database_url) == [None] * count, "the trials are kept, their conditions gone"
    upgrade(database_url)
    assert drift(database_url) == []
