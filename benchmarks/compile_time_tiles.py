"""What compile-time tiles win, and whether building ahead keeps the measuring busy (JSON on stdout).

``tiles``: ``compiled_matmul`` (float32, one thread) on each shape, the same C++ kernel built two ways
from one source: once per config with the tiles as template parameters (``tiletune_matmul``), and
once with the tiles as run-time arguments (``tiletune_matmul_runtime``). For each of a few tile
configs (and the kernel's default) both versions are timed interleaved in one run (with
``torch.matmul`` beside them, for scale): medians, p10/p90, ``static_speedup`` (run-time median /
compile-time median). Per shape, the best of each version over the configs and their ratio.

``build_ahead``: a ``compiled_matmul`` sweep (``random`` strategy, ``--trials`` configs of one shape,
nearly every one its own build, a fresh build folder each time) tuned end to end by the real worker
(isolated trials, pipelined asks, batches of 4) against the real app (SQLite, in process), once with
the build-ahead pool (``TILETUNE_BUILD_WORKERS`` unset: the cores but one) and once without (``0``:
each config built when it is measured). Reported per run, from the job driver's account of the job
(:mod:`tiletune.tuner.measure.job_driver`):

- ``measuring_s``: the trial process's calls (round trips, checks, timed runs, the validation run);
- ``build_wait_s``: the measuring waiting for a build;
- ``job_wall_s``: the worker's wall seconds for the job, and ``other_s``, the part of it that is
  neither (the trial process's start, the default's build and check, asks and tells);
- ``busy`` = ``measuring_s / job_wall_s``, and ``busy_while_measuring`` = ``measuring_s /
  (measuring_s + build_wait_s)``: of the time the measuring core had work or waited for a build,
  the part it measured (what the build-ahead decides; ``other_s`` is not the pool's);
- the builds made, ``build_s`` (this process's seconds building, summed over the pool's threads),
  configs whose build was ready when their measuring began, the load average when the run began.

The pool's threads run at the lowest priority, so a config measured on every core leaves them little
CPU: the pool gains where the measuring leaves cores idle (one-thread configs, more cores than the
measuring uses), and the figures are only meaningful on an otherwise quiet machine.

Run from the repository root: ``.venv/bin/python -m benchmarks.compile_time_tiles`` (``--quick``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from pydantic import SecretStr

from tiletune.kernels.build_cache import BuildCache, shared_cache
from tiletune.kernels.compiled_matmul.spec import as_operands, load_runtime, load_static, recipe
from tiletune.kernels.device import CpuDevice
from tiletune.kernels.registry import get_kernel
from tiletune.tuner.measure.bench import BenchSettings, measure_interleaved
from tiletune.tuner.measure.measurement import Measurement

SHAPES = ((256, 256, 256), (512, 512, 512), (1000, 1000, 1000))
QUICK_SHAPES = ((256, 256, 256), (500, 500, 500))
CONFIGS = (
    {"tile_m": 16, "tile_n": 64, "tile_k": 128},
    {"tile_m": 32, "tile_n": 64, "tile_k": 256},
    {"tile_m": 64, "tile_n": 32, "tile_k": 128},
    {"tile_m": 64, "tile_n": 128, "tile_k": 64},
    {"tile_m": 128, "tile_n": 256, "tile_k": 32},
)
SETTINGS = BenchSettings(warmup_runs=2, min_samples=15, max_samples=200, budget_s=0.3)
#: The build-ahead sweep's shape: a trial measures for about as long as a build takes (a few tenths
#: of a second), so whether the builds hide behind the measuring shows.
AHEAD_SHAPE = {"m": 256, "n": 256, "k": 256}
AHEAD_BATCH = 4


def _row(m: Measurement) -> dict[str, float]:
    return {"median_ms": m.median_ms, "p10_ms": m.p10_ms, "p90_ms": m.p90_ms, "samples": m.samples}


def _runner(call: Callable[..., int], args: tuple[int, ...]) -> Callable[[], object]:
    return lambda: call(*args)


def tiles_case(
    shape: tuple[int, int, int], configs: list[dict[str, int]], settings: BenchSettings
) -> dict[str, Any]:
    """Both builds of each config timed interleaved on one shape (one thread)."""
    m, n, k = shape
    spec = get_kernel("compiled_matmul")
    inputs = spec.make_inputs({"m": m, "n": n, "k": k}, "float32", torch.device("cpu"))
    a, b, c = as_operands(inputs)
    cache = shared_cache()
    runtime = load_runtime(cache.get(recipe(runtime_tiles=True), {}))
    pointers = (a.data_ptr(), b.data_ptr(), c.data_ptr(), m, n, k)
    rows: list[dict[str, Any]] = []
    for config in configs:
        tiles = {name: min(value, dim) for (name, value), dim in zip(config.items(), (m, n, k), strict=True)}
        static = load_static(cache.get(recipe(), tiles), tiles)
        fns = [
            _runner(static, (*pointers, 1)),
            _runner(runtime, (*pointers, tiles["tile_m"], tiles["tile_n"], tiles["tile_k"], 1)),
            lambda: torch.matmul(a, b),
        ]
        fixed, given, vendor = measure_interleaved(fns, CpuDevice(), settings)
        rows.append(
            {
                "tiles": tiles,
                "compile_time": _row(fixed),
                "run_time": _row(given),
                "torch_matmul": _row(vendor),
                "static_speedup": given.median_ms / fixed.median_ms,
                "gflops_compile_time": 2 * m * n * k / fixed.median_ms / 1e6,
            }
        )
    best_static = min(rows, key=lambda r: r["compile_time"]["median_ms"])
    best_runtime = min(rows, key=lambda r: r["run_time"]["median_ms"])
    return {
        "shape": {"m": m, "n": n, "k": k},
        "configs": rows,
        "best_compile_time": {"tiles": best_static["tiles"], **best_static["compile_time"]},
        "best_run_time": {"tiles": best_runtime["tiles"], **best_runtime["run_time"]},
        "best_speedup": best_runtime["run_time"]["median_ms"] / best_static["compile_time"]["median_ms"],
    }


class _JobTimes(logging.Handler):
    """Keeps the job driver's account of each job (its log record's ``job_time``)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.jobs: list[dict[str, float]] = []

    def emit(self, record: logging.LogRecord) -> None:
        job_time = getattr(record, "job_time", None)
        if isinstance(job_time, dict):
            self.jobs.append(job_time)


def _sweep_once(folder: str, trials: int) -> tuple[float, dict[str, float]]:
    """One sweep worked by a fresh worker: its wall seconds and the driver's account of the job."""
    from fastapi.testclient import TestClient

    from tiletune.service.app import create_app
    from tiletune.service.migrate import upgrade
    from tiletune.service.settings import Settings
    from tiletune.tuner.measure.worker import Worker

    url = f"sqlite:///{folder}/tiletune.db"
    upgrade(url)
    secret = "tt_" + secrets.token_urlsafe(32)
    app_settings = Settings(db_url=url, admin_token=SecretStr(secret))
    driver_log = logging.getLogger("tiletune.tuner.measure.job_driver")
    times = _JobTimes()
    driver_log.addHandler(times)
    driver_log.setLevel(logging.INFO)
    try:
        with TestClient(
            create_app(app_settings, reaper=False), headers={"Authorization": f"Bearer {secret}"}
        ) as app:
            sweep = {
                "kernel": "compiled_matmul",
                "shapes": [AHEAD_SHAPE],
                "trials": trials,
                "strategy": "random",
            }
            assert app.post("/v1/sweeps", json=sweep).status_code == 201
            with Worker(app, backend="cpu", batch=AHEAD_BATCH, name="bench") as worker:
                started = time.monotonic()
                worker.run(once=True)
                wall_s = time.monotonic() - started
    finally:
        driver_log.removeHandler(times)
    (job,) = times.jobs
    return wall_s, job


def ahead_case(trials: int, workers: str | None) -> dict[str, Any]:
    """One sweep through the real app and worker in a fresh build folder; see the module docstring."""
    from tiletune.tuner.measure.build_ahead import shared_build_ahead

    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as folder:
        os.environ["TILETUNE_BUILD_DIR"] = str(Path(folder) / "builds")
        if workers is None:
            os.environ.pop("TILETUNE_BUILD_WORKERS", None)
        else:
            os.environ["TILETUNE_BUILD_WORKERS"] = workers
        ahead, cache = shared_build_ahead(), shared_cache()
        before = ahead.stats.as_dict()
        wall_s, job = _sweep_once(folder, trials)
        after = ahead.stats.as_dict()
        built = len(BuildCache(Path(folder) / "builds").entries(recipe()))
    return {
        "build_workers": ahead.workers,
        "load_average_1m": load,
        "trials": job["trials"],
        "builds": built,
        "build_s": cache.stats.build_s,
        "job_wall_s": wall_s,
        "measuring_s": job["measuring_s"],
        "build_wait_s": job["build_wait_s"],
        "other_s": wall_s - job["measuring_s"] - job["build_wait_s"],
        "busy": job["measuring_s"] / wall_s,
        "busy_while_measuring": job["measuring_s"] / (job["measuring_s"] + job["build_wait_s"]),
        "ready_when_measured": after["ready"] - before["ready"],
        "waits": after["waits"] - before["waits"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer shapes, configs and trials")
    parser.add_argument("--trials", type=int, default=32, help="configs of the build-ahead sweep")
    parser.add_argument("--skip-ahead", action="store_true", help="only the tiles comparison")
    options = parser.parse_args()
    torch.set_num_threads(1)
    shapes = QUICK_SHAPES if options.quick else SHAPES
    configs = list(CONFIGS[1:4] if options.quick else CONFIGS)
    spec = get_kernel("compiled_matmul")
    limits = CpuDevice().chip.limits
    with tempfile.TemporaryDirectory() as folder:
        os.environ["TILETUNE_BUILD_DIR"] = folder
        cases = []
        for shape in shapes:
            dims = spec.parse_shape(dict(zip("mnk", shape, strict=True)))
            default = spec.build_values(spec.default_config(dims, "float32", limits))
            cases.append(tiles_case(shape, [*configs, default], SETTINGS))
    report: dict[str, Any] = {"benchmark": "compile_time_tiles", "threads": 1, "tiles": cases}
    if not options.skip_ahead:
        trials = 16 if options.quick else options.trials
        report["build_ahead"] = {
            "with_pool": ahead_case(trials, None),
            "without_pool": ahead_case(trials, "0"),
        }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
