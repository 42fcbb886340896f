"""The real worker against the real app (in process, through Starlette's TestClient), on SQLite."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.credentials import ADMIN, ADMIN_SECRET
from tiletune.service.app import create_app
from tiletune.service.migrate import upgrade
from tiletune.service.settings import Settings
from tiletune.tuner.measure.bench import BenchSettings
from tiletune.tuner.measure.worker import Worker

QUICK = BenchSettings(warmup_runs=1, min_samples=3, budget_s=0.02, max_samples=10)


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    url = f"sqlite:///{tmp_path / 'tiletune.db'}"
    upgrade(url)
    settings = Settings(db_url=url, admin_token=ADMIN_SECRET)
    with TestClient(create_app(settings, reaper=False), headers=ADMIN) as test_client:
        yield test_client


def test_a_worker_tunes_every_job_of_a_sweep_and_promotes_its_winners(client: TestClient) -> None:
    sweep = {
        "kernel": "softmax",
        "shapes": [{"rows": 16, "cols": 64}, {"rows": 32, "cols": 128}],
        "trials": 5,
    }
    assert client.post("/v1/sweeps", json=sweep).status_code == 201
    worker = Worker(client, backend="cpu", bench=QUICK, batch=2, name="test")
    assert worker.run(once=True) == 2
    jobs = client.get("/v1/jobs").json()
    assert [job["state"] for job in jobs] == ["done", "done"]
    chip = worker.device.chip.name
    for job in jobs:
        found = client.get(
            "/v1/configs/softmax", params={"shape": job["shape_key"], "chip": chip, "match": "exact"}
        ).json()
        assert found["config"] == job["progress"]["best_config"]
        assert found["best"]["default_ms"] > 0


def test_a_stopped_worker_releases_its_lease_and_the_job_goes_back_to_the_queue(client: TestClient) -> None:
    sweep = {"kernel": "add", "shapes": [{"n": 8192}], "trials": 50}
    assert client.post("/v1/sweeps", json=sweep).status_code == 201
    worker = Worker(client, backend="cpu", bench=QUICK, name="stopper")
    # Stop the worker as its third tell goes out (a SIGTERM at that moment); every outcome it
    # measured must still be told before it releases the lease.
    tells = 0
    told: set[int] = set()
    original_send = client.send

    def send(request: httpx.Request, **kwargs: Any) -> httpx.Response:
        nonlocal tells
        if request.url.path.endswith("/tell"):
            tells += 1
            told.update(outcome["trial_id"] for outcome in json.loads(request.content)["outcomes"])
            if tells == 3:
                worker.stop()
        response: httpx.Response = original_send(request, **kwargs)
        return response

    client.send = send
    try:
        worker.run(once=True)
    finally:
        client.send = original_send
    job = client.get("/v1/jobs").json()[0]
    assert job["state"] == "queued"
    assert job["progress"]["completed"] == len(told) >= 3
    trials = client.get(f"/v1/jobs/{job['id']}/trials").json()
    assert {t["state"] for t in trials} <= {"measured", "abandoned"}  # nothing left held
    assert job["lease_failures"] == 0
