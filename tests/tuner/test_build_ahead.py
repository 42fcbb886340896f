"""Building ahead of measuring, and ``compiled_matmul`` tuned end to end through the service.

The sweep runs on the real app (SQLite, in process through Starlette's TestClient) with the real
worker; every build is a real compile into a build folder of the test's own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.credentials import ADMIN, ADMIN_SECRET
from tiletune.kernels import get_kernel
from tiletune.kernels.build_cache import BuildCache, shared_cache
from tiletune.kernels.compiled_matmul.spec import recipe
from tiletune.kernels.device import CpuDevice
from tiletune.service.app import create_app
from tiletune.service.cli import main
from tiletune.service.migrate import upgrade
from tiletune.service.settings import Settings
from tiletune.tuner.measure.bench import BenchSettings, KernelBench
from tiletune.tuner.measure.build_ahead import (
    BUILD_NICENESS,
    BuildAhead,
    default_workers,
    shared_build_ahead,
)
from tiletune.tuner.measure.worker import Worker

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

QUICK = BenchSettings(warmup_runs=1, min_samples=3, budget_s=0.02, max_samples=10)
#: A shape whose tile knobs take two values each (16 and 32): at most 8 builds.
SMALL = {"m": 32, "n": 32, "k": 32}


@pytest.fixture(autouse=True)
def build_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "builds"
    monkeypatch.setenv("TILETUNE_BUILD_DIR", str(folder))
    return folder


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    url = f"sqlite:///{tmp_path / 'tiletune.db'}"
    upgrade(url)
    settings = Settings(db_url=url, admin_token=ADMIN_SECRET)
    with TestClient(create_app(settings, reaper=False), headers=ADMIN) as test_client:
        yield test_client


def small_bench(kernel: str = "compiled_matmul") -> KernelBench:
    spec = get_kernel(kernel)
    return KernelBench(spec, spec.parse_shape(SMALL), "float32", CpuDevice(), None, QUICK)


def test_the_pool_builds_a_batch_ahead_and_measuring_finds_it_ready(build_dir: Path) -> None:
    builds = BuildAhead(workers=2)
    bench = small_bench()
    configs = [
        {"tile_m": 16, "tile_n": 16, "tile_k": 16, "block_dim": 1},
        {"tile_m": 16, "tile_n": 16, "tile_k": 16, "block_dim": 2},  # the same build
        {"tile_m": 32, "tile_n": 16, "tile_k": 32, "block_dim": 1},
        {"tile_m": 32, "tile_n": 32, "tile_k": 32, "block_dim": 2},  # invalid: 1 tile, 2 cores
        {"tile_m": 48, "tile_n": 16, "tile_k": 16, "block_dim": 1},  # outside the space
    ]
    try:
        assert builds.submit(bench, configs) == 2
        assert builds.submit(bench, configs) == 0  # submitted once
        for config in configs[:3]:
            builds.ready(bench, config)
    finally:
        builds.close()
    assert len(BuildCache(build_dir).entries(recipe())) == 2
    assert builds.stats.ready + builds.stats.waits == 3
    assert bench.evaluate(configs[2]).ok


@pytest.mark.skipif(sys.platform != "linux", reason="a thread's own nice value is Linux's")
def test_the_pool_and_the_compilers_it_starts_yield_to_the_measuring() -> None:
    builds = BuildAhead(workers=1)
    bench = small_bench()
    try:
        assert builds.submit(bench, [{"tile_m": 16, "tile_n": 16, "tile_k": 16, "block_dim": 1}]) == 1
        assert builds._pool is not None
        started = builds._pool.submit(subprocess.run, ["nice"], capture_output=True, text=True, check=True)
        assert started.result().stdout.strip() == str(BUILD_NICENESS)
    finally:
        builds.close()
    assert os.getpriority(os.PRIO_PROCESS, 0) < BUILD_NICENESS  # the measuring's priority is its own


def test_a_kernel_without_build_knobs_is_never_built() -> None:
    builds = BuildAhead(workers=1)
    bench = small_bench("native_matmul") if get_kernel("native_matmul").supports("cpu") else None
    bench = bench or KernelBench(get_kernel("add"), {"n": 64}, "float32", CpuDevice(), None, QUICK)
    assert (
        builds.submit(bench, [bench.spec.default_config(bench.shape, "float32", bench.device.chip.limits)])
        == 0
    )
    builds.ready(bench, bench.spec.default_config(bench.shape, "float32", bench.device.chip.limits))
    assert builds.stats.as_dict() == {"submitted": 0, "ready": 0, "waits": 0, "waited_s": 0.0}
    assert builds._pool is None  # no thread started


def test_without_a_pool_each_config_is_built_when_it_is_measured(build_dir: Path) -> None:
    builds = BuildAhead(workers=0)
    bench = small_bench()
    config = {"tile_m": 16, "tile_n": 32, "tile_k": 16, "block_dim": 1}
    assert builds.submit(bench, [config]) == 0
    builds.ready(bench, config)
    assert builds.stats.waits == 1
    assert builds.stats.waited_s > 0
    assert len(BuildCache(build_dir).entries(recipe())) == 1


def test_default_workers_leave_the_measuring_a_core(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TILETUNE_BUILD_WORKERS", raising=False)
    assert default_workers() >= 1
    monkeypatch.setenv("TILETUNE_BUILD_WORKERS", "0")
    assert default_workers() == 0


def test_local_tuning_builds_each_config_before_timing_it_and_builds_the_next_ahead(
    build_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TILETUNE_BUILD_WORKERS", "1")
    builds = shared_build_ahead()
    before = builds.stats.as_dict()
    shape = ",".join(f"{dim}={size}" for dim, size in SMALL.items())
    argv = ["tune", "compiled_matmul", "--shape", shape, "--dtype", "float32", "--trials", "4", "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    after = builds.stats.as_dict()

    assert report["trials"]["completed"] == 4, report["trials"]
    assert report["best"]["median_ms"] > 0
    assert report["best"]["samples"] >= 5  # a real measurement: BenchSettings' minimum samples
    assert report["best"]["config"] in [row["config"] for row in report["validated"]]
    assert after["submitted"] - before["submitted"] >= 1  # asked ahead and built meanwhile
    # each measured config's build was in the cache before its check and timed runs began
    assert (after["ready"] + after["waits"]) - (before["ready"] + before["waits"]) >= 4
    tiles = {(c["tile_m"], c["tile_n"], c["tile_k"]) for c in [row["config"] for row in report["validated"]]}
    assert 1 <= len(tiles) <= len(BuildCache(build_dir).entries(recipe())) <= 4  # nothing built unmeasured


def test_compiled_matmul_is_tuned_through_the_service_and_a_second_job_builds_nothing(
    client: TestClient, build_dir: Path
) -> None:
    sweep = {"kernel": "compiled_matmul", "shapes": [SMALL], "trials": 20, "strategy": "grid"}
    cache = shared_cache()
    worker = Worker(client, backend="cpu", bench=QUICK, batch=2, name="builder")
    try:
        assert client.post("/v1/sweeps", json=sweep).status_code == 201
        assert worker.run(once=True) == 1
        job = client.get("/v1/jobs").json()[0]
        assert job["state"] == "done", job
        trials = client.get(f"/v1/jobs/{job['id']}/trials").json()
        assert [t for t in trials if t["state"] == "measured"], trials
        built = BuildCache(build_dir).entries(recipe())
        assert len(built) == 8  # every tile combination of the grid
        # every build was made in the worker's process (the default before its trial process checked
        # it, timed; the rest ahead of their measuring): the trial process compiled nothing
        assert cache.stats.built == len(built)
        found = client.get(
            "/v1/configs/compiled_matmul",
            params={"shape": job["shape_key"], "chip": worker.device.chip.name, "match": "exact"},
        ).json()
        assert found["config"] == job["progress"]["best_config"]

        before = cache.stats.built
        assert client.post("/v1/sweeps", json={**sweep, "force": True}).status_code == 201
        assert worker.run(once=True) == 1
        assert [job["state"] for job in client.get("/v1/jobs").json()] == ["done", "done"]
        assert cache.stats.built == before  # nothing built by this process
        assert BuildCache(build_dir).entries(recipe()) == built  # nor by the trial process
    finally:
        worker.close()
