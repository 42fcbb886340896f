"""The same tuning job run locally and through the service: wall-time ratio and per-trial overhead.

Local: ``tune()`` in this process. Service: a real ``tiletune server`` process
(fresh SQLite file) and one :class:`~tiletune.tuner.measure.worker.Worker` in this
process (its defaults: batched, pipelined asks; connected and registered once, as a worker
process is for many jobs), from ``POST /v1/sweeps`` until the job is ``done``. Both use the
same kernel, shape, search (tpe, same seed, same trial budget), implementation (the one local
tuning picks on this CPU: ``native`` where it is built) and bench settings, and both end
with an interleaved validation of the top configs and the default. The two
are run alternately (``--repeats`` pairs) so drift on a noisy machine hits
both; the JSON reports medians and spread of the wall times, their ratio,
and ``(service - local) / trials`` as the per-trial overhead in ms.

Run from the repository root: ``.venv/bin/python -m benchmarks.service_overhead [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.http_lookup import AUTH, free_port, start_server
from tiletune.client.wire import DEFAULT_BATCH
from tiletune.kernels import get_kernel
from tiletune.kernels.device import get_device
from tiletune.kernels.native.spec import preferred_backend
from tiletune.tuner.measure.bench import BenchSettings
from tiletune.tuner.measure.tune import TuneOptions, tune
from tiletune.tuner.measure.worker import Worker

KERNEL = "softmax"
SHAPE = {"rows": 256, "cols": 1024}
BENCH = BenchSettings(budget_s=0.05, max_samples=30, target_rel_ci=0.02)


def run_local(trials: int, seed: int) -> float:
    """Wall seconds of local tuning."""
    started = time.perf_counter()
    options = TuneOptions(trials=trials, seed=seed, bench=BENCH)
    tune(get_kernel(KERNEL), SHAPE, "float32", get_device("cpu"), options)
    return time.perf_counter() - started


def run_service(worker: Worker, http: httpx.Client, trials: int, seed: int) -> float:
    """Wall seconds from submitting the sweep to its job being done (a registered, idle worker)."""
    sweep = {"kernel": KERNEL, "shapes": [SHAPE], "trials": trials, "seed": seed, "force": True}
    sweep["backend"] = preferred_backend(get_kernel(KERNEL), "cpu")  # what local tuning runs
    started = time.perf_counter()
    response = http.post("/v1/sweeps", json=sweep)
    response.raise_for_status()
    job_id = response.json()["jobs"][0]["id"]
    worker.run(max_jobs=1, once=True)
    wall = time.perf_counter() - started
    state = http.get(f"/v1/jobs/{job_id}").json()["state"]
    if state != "done":
        raise RuntimeError(f"job {job_id} ended {state}")
    return wall


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3, help="local/service pairs, alternated (default 3)")
    parser.add_argument("--trials", type=int, default=30, help="trial budget of the job (default 30)")
    parser.add_argument(
        "--batch", type=int, default=DEFAULT_BATCH, help=f"configs per ask (default {DEFAULT_BATCH})"
    )
    args = parser.parse_args()
    local: list[float] = []
    service: list[float] = []
    with tempfile.TemporaryDirectory() as folder:
        port = free_port()
        server = start_server(f"sqlite:///{Path(folder) / 'overhead.db'}", port)
        try:
            base = f"http://127.0.0.1:{port}"
            # A worker process lives for many jobs: connecting and registering is not a job's cost.
            with httpx.Client(base_url=base, headers=AUTH, timeout=30) as http:
                worker = Worker(http, backend="cpu", bench=BENCH, name="overhead", batch=args.batch)
                worker.register()
                for repeat in range(args.repeats):
                    local.append(run_local(args.trials, seed=repeat))
                    service.append(run_service(worker, http, args.trials, seed=repeat))
                worker.close()
        finally:
            server.terminate()
            server.wait(timeout=30)
    ratios = [s / loc for s, loc in zip(service, local, strict=True)]
    overhead = [(s - loc) / args.trials * 1e3 for s, loc in zip(service, local, strict=True)]
    report: dict[str, Any] = {
        "benchmark": "service_overhead",
        "kernel": KERNEL,
        "shape": SHAPE,
        "trials": args.trials,
        "batch": args.batch,
        "local_wall_s": spread(local),
        "service_wall_s": spread(service),
        "service_over_local": spread(ratios),
        "overhead_per_trial_ms": spread(overhead),
        "pairs": [
            {"local_s": loc, "service_s": s} for loc, s in zip(local, service, strict=True)
        ],  # in the order run
    }
    json.dump(report, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
