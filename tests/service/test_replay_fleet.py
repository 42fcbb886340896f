"""Replay workers against the service: sweeps of recorded-space variants tuned to ``done``.

A replay worker (``--backend replay``) measures by lookup, so these runs cost the service's
work alone. Checked on the database's record (the trials the server stored): every measured
trial carries the time the recording gives its config at its job's variant (no result told
to the wrong job), every job completes with its trial budget, and the promoted best of each
key is the best of the trials the server recorded for it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.credentials import ADMIN, ADMIN_SECRET
from tiletune.kernels.declarations import all_declarations
from tiletune.kernels.registry import all_kernels
from tiletune.kernels.replay.declaration import REPLAY_KERNELS_ENV, variant_sweep
from tiletune.kernels.replay.spec import ReplayKernelSpec, replay_kernels
from tiletune.service.app import create_app
from tiletune.service.migrate import upgrade
from tiletune.service.settings import Settings
from tiletune.tuner.measure.worker import Worker

from .processes import run_cli, spawn, start_server, stop

BUNDLED = Path(__file__).parents[1] / "data" / "replay"
KERNEL = "replay_pnpoly_RTX_3090"
CHIP = "replay/recorded"
REPLAY_ENV = {REPLAY_KERNELS_ENV: str(BUNDLED)}


@pytest.fixture
def spec() -> ReplayKernelSpec:
    return replay_kernels(BUNDLED)[KERNEL]


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    """The app in process on SQLite, with the bundled recordings registered as kernels."""
    monkeypatch.setenv(REPLAY_KERNELS_ENV, str(BUNDLED))
    all_kernels.cache_clear()
    all_declarations.cache_clear()
    url = f"sqlite:///{tmp_path / 'tiletune.db'}"
    upgrade(url)
    settings = Settings(db_url=url, admin_token=ADMIN_SECRET)
    with TestClient(create_app(settings, reaper=False), headers=ADMIN) as test_client:
        yield test_client
    monkeypatch.delenv(REPLAY_KERNELS_ENV)
    all_kernels.cache_clear()
    all_declarations.cache_clear()


def assert_best_is_the_best_recorded_trial(
    http: httpx.Client | TestClient, spec: ReplayKernelSpec, job: dict[str, Any]
) -> None:
    """The job is done with its budget; each trial's time is the recording's; the best is promoted."""
    assert job["state"] == "done", job
    variant = job["shape"]["variant"]
    trials = http.get(f"/v1/jobs/{job['id']}/trials").json()
    searched = [t for t in trials if t["phase"] == "search"]
    measured = [t for t in searched if t["state"] == "measured"]
    assert len(measured) == job["progress"]["completed"]
    assert len(measured) + job["progress"]["failed"] == job["trials"]
    for trial in searched:
        recorded = spec.recorded(trial["config"], {"variant": variant})
        if trial["state"] == "measured":
            assert trial["median_ms"] == recorded.time_ms
        else:
            assert (trial["state"], trial["reason"]) == ("failed", recorded.error)
    best = min(measured, key=lambda t: t["median_ms"])
    found = http.get(
        f"/v1/configs/{KERNEL}", params={"shape": f"variant={variant}", "chip": CHIP, "match": "exact"}
    ).json()
    assert found["match"] == "exact"
    assert found["best"]["median_ms"] == best["median_ms"]
    assert spec.recorded(found["config"], {"variant": variant}).time_ms == best["median_ms"]


def test_a_replay_worker_tunes_a_sweep_of_variants_in_process(
    client: TestClient, spec: ReplayKernelSpec
) -> None:
    sweep = variant_sweep(KERNEL, 3, trials=12, chip=CHIP)
    assert client.post("/v1/sweeps", json=sweep).status_code == 201
    worker = Worker(client, backend="replay", batch=4, name="replay-in-process")
    assert worker.run(once=True) == 3
    jobs = client.get("/v1/jobs").json()
    assert sorted(job["shape"]["variant"] for job in jobs) == [1, 2, 3]
    for job in jobs:
        assert_best_is_the_best_recorded_trial(client, spec, job)
    bests = {job["progress"]["best_ms"] for job in jobs}
    assert len(bests) == 3  # the variants are distinct problems


@pytest.mark.slow
def test_replay_worker_processes_tune_a_submitted_sweep_on_a_server_process(
    tmp_path: Path, database_url: str, spec: ReplayKernelSpec
) -> None:
    server = start_server(tmp_path, db_url=database_url, env=REPLAY_ENV)
    logs = [server.log_path, tmp_path / "replay-1.log", tmp_path / "replay-2.log"]
    workers = [
        spawn(
            ["worker", "--server", server.url, "--backend", "replay", "--batch", "4", "--name", log.stem],
            log,
            REPLAY_ENV,
        )
        for log in logs[1:]
    ]
    try:
        sweep_file = tmp_path / "sweep.json"
        sweep_file.write_text(json.dumps(variant_sweep(KERNEL, 4, trials=15, chip=CHIP, seed=1)))
        submitted = run_cli(
            "submit", str(sweep_file), "--server", server.url, "--wait", "--timeout", "150", timeout_s=180
        )
        assert submitted.returncode == 0, submitted.stderr + "\n".join(p.read_text() for p in logs)
        with httpx.Client(base_url=server.url, headers=ADMIN, timeout=10) as http:
            jobs = http.get("/v1/jobs").json()
            assert len(jobs) == 4
            for job in jobs:
                assert_best_is_the_best_recorded_trial(http, spec, job)
    finally:
        for worker in workers:
            stop(worker)
        stop(server.process)
