"""The same tuning job run locally and through the service: wall-time ratio and per-trial overhead.

Local: ``tune()`` in this process. Service: a real ``tiletune server`` process
(fresh SQLite file) and one :class:`~tiletune.tuner.worker.Worker` in this
process (its defaults: batched, pipelined asks), from ``POST /v1/sweeps`` until
the job is ``done``. Both use the same kernel, shape,
search (tpe, same seed, same trial budget) and bench settings, and both end
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
from tiletune.kernels import get_kernel
from tiletune.kernels.device import get_device
from tiletune.tuner.bench import BenchSettings
from tiletune.tuner.tune import TuneOptions, tune
from tiletune.tuner.worker import Worker

KERNEL = "softmax"
SHAPE = {"rows": 256, "cols": 1024}
BENCH = BenchSettings(budget_s=0.05, max_samples=30, target_rel_ci=0.02)


def run_local(trials: int, seed: int) -> float:
    """Wall seconds of local tuning."""
    started = time.perf_counter()
    options = TuneOptions(trials=trials, seed=seed, bench=BENCH)
    tune(get_kernel(KERNEL), SHAPE, "float32", get_device("cpu"), options)
    return time.perf_counter() - started


def run_service(base: str, trials: int, seed: int) -> float:
    """Wall seconds from submitting the sweep to its job being done (one in-process worker)."""
    sweep = {"kernel": KERNEL, "shapes": [SHAPE], "trials": trials, "seed": seed, "force": True}
    started = time.perf_counter()
    response = httpx.post(f"{base}/v1/sweeps", json=sweep, headers=AUTH, timeout=30)
    response.raise_for_status()
    job_id = response.json()["jobs"][0]["id"]
    with httpx.Client(base_url=base, headers=AUTH, timeout=30) as http:
        worker = Worker(http, backend="cpu", bench=BENCH, name="overhead")
        worker.run(max_jobs=1, once=True)
        state = http.get(f"/v1/jobs/{job_id}").json()["state"]
    wall = time.perf_counter() - started
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
    args = parser.parse_args()
    local: list[float] = []
    service: list[float] = []
    with tempfile.TemporaryDirectory() as folder:
        port = free_port()
        server = start_server(f"sqlite:///{Path(folder) / 'overhead.db'}", port)
        try:
            base = f"http://127.0.0.1:{port}"
            for repeat in range(args.repeats):
                local.append(run_local(args.trials, seed=repeat))
                service.append(run_service(base, args.trials, seed=repeat))
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
        "local_wall_s": spread(local),
        "service_wall_s": spread(service),
        "service_over_local": spread(ratios),
        "overhead_per_trial_ms": spread(overhead),
    }
    json.dump(report, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
