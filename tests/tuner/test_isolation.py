"""Isolated trials: a config that crashes, hangs or poisons the device fails alone; the worker survives.

The kernel is :mod:`tests.tuner.faulty_kernel` (a segfault, a hang, a device error among correct
tilings). The pool's tests run it in a real spawned child; the job's test runs the real worker
against the real app on SQLite, with the kernel registered as a plugin would be.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.credentials import ADMIN, ADMIN_SECRET
from tests.tuner import faulty_kernel
from tests.tuner.faulty_kernel import DEFAULT_TILE, DEVICE_ERROR_TILE, FAULTS, HANG_TILE, SEGFAULT_TILE
from tiletune.kernels.declarations import all_declarations
from tiletune.kernels.device import CpuDevice
from tiletune.kernels.registry import all_kernels
from tiletune.service.app import create_app
from tiletune.service.migrate import upgrade
from tiletune.service.settings import Settings
from tiletune.tuner.measure.bench import BenchSettings
from tiletune.tuner.measure.isolation import (
    DefaultFailedError,
    IsolatedBench,
    IsolationSettings,
    TrialPool,
    looks_like_device_error,
    trial_limit,
)
from tiletune.tuner.measure.worker import Worker

QUICK = BenchSettings(warmup_runs=1, min_samples=3, max_samples=5, budget_s=0.01)
#: A hang is declared after 2 s (the floor; the faulty kernel's default takes microseconds).
SHORT = IsolationSettings(floor_s=2.0, start_limit_s=120.0, cooldown_s=0.0)
SHAPE = {"n": 4096}
#: The start limit of the hanging default's test: a fresh process starts and builds in about 5 s.
HANG_LIMIT_S = 20.0


def tile(size: int) -> dict[str, int]:
    return {"tile_size": size}


@pytest.fixture
def pool() -> Iterator[TrialPool]:
    trials = TrialPool(SHORT)
    yield trials
    trials.close()


def faulty_bench(pool: TrialPool, spec: faulty_kernel.FaultySpec = faulty_kernel.SPEC) -> IsolatedBench:
    return pool.bench(spec, dict(SHAPE), "float32", CpuDevice(), backend=None, settings=QUICK)


# -- the pool -----------------------------------------------------------------------------------------


def test_the_trial_process_stays_warm_across_trials_and_leases(pool: TrialPool) -> None:
    bench = faulty_bench(pool)
    assert bench.default_ms is not None
    assert bench.default_ms > 0
    pid = pool.process.pid
    first = bench.evaluate(tile(256))
    second = bench.evaluate(tile(16))
    assert first.ok
    assert second.ok
    assert bench.check(tile(DEFAULT_TILE)) is None
    again = faulty_bench(pool)  # the next lease of the same key: same child, same bench
    assert again.evaluate(tile(256)).ok
    assert pool.process.pid == pid
    assert pool.process.started == 1


def test_a_segfault_fails_the_config_and_a_fresh_process_measures_the_next(pool: TrialPool) -> None:
    bench = faulty_bench(pool)
    pid = pool.process.pid
    crashed = bench.evaluate(tile(SEGFAULT_TILE))
    assert crashed.measurement is None
    assert crashed.error == "the trial process died: signal SIGSEGV"
    assert not pool.process.alive
    assert bench.evaluate(tile(256)).ok
    assert pool.process.pid not in (None, pid)
    assert pool.process.started == 2


def test_a_hang_is_killed_at_the_limit(pool: TrialPool) -> None:
    bench = faulty_bench(pool)
    start = time.monotonic()
    hung = bench.evaluate(tile(HANG_TILE))
    elapsed_s = time.monotonic() - start
    assert hung.error is not None
    assert hung.error.startswith("timed out after 2 s (limit: ")
    assert 2.0 <= elapsed_s < 30.0
    assert bench.evaluate(tile(DEFAULT_TILE)).ok


def test_a_device_error_fails_the_config_and_replaces_the_process(pool: TrialPool) -> None:
    bench = faulty_bench(pool)
    pid = pool.process.pid
    poisoned = bench.evaluate(tile(DEVICE_ERROR_TILE))
    assert poisoned.error == "DeviceError: an illegal memory access was encountered"
    assert not pool.process.alive  # its device context is not trusted any more
    assert bench.evaluate(tile(256)).ok
    assert pool.process.pid != pid


def test_the_validation_run_is_isolated_too(pool: TrialPool) -> None:
    bench = faulty_bench(pool)
    measurements = bench.compare([tile(16), tile(DEFAULT_TILE)])
    assert [m.samples for m in measurements] == [measurements[0].samples] * 2
    assert all(m.median_ms > 0 for m in measurements)


def test_a_default_a_fresh_process_cannot_run_is_the_kernels_fault_while_a_built_in_runs(
    pool: TrialPool,
) -> None:
    with pytest.raises(DefaultFailedError, match="SIGSEGV") as failed:
        faulty_bench(pool, faulty_kernel.BROKEN_DEFAULT_SPEC)
    assert "a built-in kernel runs here: the kernel's fault" in str(failed.value)
    assert pool.health_problem(CpuDevice()) is None  # the device is fine, as the error said


def test_a_default_that_hangs_fails_within_the_start_limit() -> None:
    pool = TrialPool(IsolationSettings(floor_s=2.0, start_limit_s=HANG_LIMIT_S, cooldown_s=0.0))
    started = time.monotonic()
    try:
        with pytest.raises(DefaultFailedError, match="timed out after"):
            faulty_bench(pool, faulty_kernel.HANGING_DEFAULT_SPEC)
    finally:
        pool.close()
    # the start limit, then the health check's fresh process (about 5 s here)
    assert time.monotonic() - started < HANG_LIMIT_S + 60


def test_the_limit_grows_with_the_default_time_above_its_floor() -> None:
    settings = BenchSettings(warmup_runs=2, min_samples=5, budget_s=0.4, against_default=False)
    isolation = IsolationSettings(floor_s=10.0, slowdown=10.0)
    assert trial_limit(settings, isolation, None).seconds == 10.0
    assert trial_limit(settings, isolation, 1.0).seconds == 10.0  # 10 x 9 runs x 1 ms + 0.8 s
    slow = trial_limit(settings, isolation, 1000.0)
    assert slow.seconds == pytest.approx(10 * 9 * 1.0 + 0.8)
    assert "default 1e+03 ms" in slow.basis
    # timed again beside the default: (10 + 1) x (2 + 4 + 5 + 1) runs of 1 s, 4 budgets, 2 x 500 settles
    paired = trial_limit(dataclasses.replace(settings, against_default=True), isolation, 1000.0)
    assert paired.seconds == pytest.approx(10 * 9 * 1.0 + 0.8 + 11 * 12 * 1.0 + 1.6 + 1000 * 0.001)
    assert "against the default" in paired.basis
    # a validation run: its settings (3 x 0.4 s budget, 500 rounds of 1 ms settles), 4 more warm-ups
    compare = trial_limit(settings, isolation, 1000.0, configs=3).seconds
    assert compare == pytest.approx(3 * (10 * (2 + 4 + 5 + 1) * 1.0 + 2 * 1.2 + 500 * 0.001))


@pytest.mark.parametrize(
    ("text", "device"),
    [
        ("RuntimeError: CUDA error: an illegal memory access was encountered", True),
        ("RuntimeError: The Inner error is reported as above. EZ9999: AICORE exception", True),
        ("DeviceError: ub overflow", True),
        ("wrong result: 3 elements off", False),
        (None, False),
    ],
)
def test_device_errors_are_told_from_config_errors(text: str | None, device: bool) -> None:
    assert looks_like_device_error(text) is device


# -- a job through the service ---------------------------------------------------------------------------


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    # the kernel is registered as a plugin's entry points would register it: declaration and spec
    for registry in (all_kernels(), all_declarations()):
        monkeypatch.setitem(registry, faulty_kernel.SPEC.name, faulty_kernel.SPEC)
    url = f"sqlite:///{tmp_path / 'tiletune.db'}"
    upgrade(url)
    settings = Settings(db_url=url, admin_token=ADMIN_SECRET)
    with TestClient(create_app(settings, reaper=False), headers=ADMIN) as test_client:
        yield test_client


def test_crashing_hanging_and_poisoning_configs_fail_alone_and_the_job_promotes_the_rest(
    client: TestClient,
) -> None:
    sweep = {"kernel": "faulty", "shapes": [SHAPE], "strategy": "grid", "trials": len(faulty_kernel.TILES)}
    assert client.post("/v1/sweeps", json=sweep).status_code == 201
    worker = Worker(client, backend="cpu", bench=QUICK, batch=2, name="isolated", isolation=SHORT)
    with worker:
        assert worker.run(once=True) == 1
        job = client.get("/v1/jobs").json()[0]
        assert job["state"] == "done"
        trials = client.get(f"/v1/jobs/{job['id']}/trials").json()
        searched = {t["config"]["tile_size"]: t for t in trials if t["number"] is not None}
        assert set(searched) == set(faulty_kernel.TILES)
        for size, reason in FAULTS.items():
            assert searched[size]["state"] == "failed", searched[size]
            assert reason in searched[size]["reason"]
        healthy = set(faulty_kernel.TILES) - set(FAULTS)
        assert {searched[size]["state"] for size in healthy} == {"measured"}
        best = job["progress"]["best_config"]
        assert best["tile_size"] in healthy
        found = client.get(
            "/v1/configs/faulty",
            params={"shape": job["shape_key"], "chip": worker.device.chip.name, "match": "exact"},
        ).json()
        assert found["config"] == best
        page = client.get(f"/jobs/{job['id']}").text
        assert "signal SIGSEGV" in page
        # the worker lives on and works the next job
        assert (
            client.post(
                "/v1/sweeps", json={"kernel": "add", "shapes": [{"n": 4096}], "trials": 3}
            ).status_code
            == 201
        )
        assert worker.run(once=True) == 1
        assert [j["state"] for j in client.get("/v1/jobs").json()] == ["done", "done"]


def test_a_default_that_cannot_run_fails_its_job_and_the_worker_leases_on(
    client: TestClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    broken = faulty_kernel.BROKEN_DEFAULT_SPEC
    for registry in (all_kernels(), all_declarations()):
        monkeypatch.setitem(registry, broken.name, broken)
    assert (
        client.post("/v1/sweeps", json={"kernel": broken.name, "shapes": [SHAPE], "trials": 3}).status_code
        == 201
    )
    worker = Worker(client, backend="cpu", bench=QUICK, name="usable", isolation=SHORT)
    with worker, caplog.at_level("ERROR", logger="tiletune.tuner.measure.worker"):
        # each lease fails at once; the server fails the job after its limit of failed leases
        assert worker.run(once=True) == 3
        job = client.get("/v1/jobs").json()[0]
        assert job["state"] == "failed"
        assert job["lease_failures"] == 3
        assert all("the default cannot run" in reason for reason in job["failure_reasons"])
        assert all("the kernel's fault" in reason for reason in job["failure_reasons"])
        # the device was never taken for unusable: the next job runs at once
        sweep = {"kernel": "add", "shapes": [{"n": 4096}], "trials": 3}
        assert client.post("/v1/sweeps", json=sweep).status_code == 201
        assert worker.run(once=True) == 1
        states = {job["kernel"]: job["state"] for job in client.get("/v1/jobs").json()}
        assert states == {broken.name: "failed", "add": "done"}
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len([m for m in errors if "its default cannot run" in m and "SIGSEGV" in m]) == 3
    assert not [m for m in errors if "unusable" in m]
