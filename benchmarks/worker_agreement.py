"""How far two honest workers of one chip disagree on one config: the tolerance a confirmation allows.

A real ``tiletune server`` (fresh SQLite file) and two real ``tiletune worker`` processes of this
CPU (one torch thread each, as the tests run them) tune a sweep of keys, one worker per job. The
worker whose search trial leads never validates while the other is online
(``tiletune.service.scheduling.confirmation``), so every job's validation run is the other worker's. Each
finalist measured in the search by one worker and in the validation run by the other is a pair;
the document reports each pair's ratio (validation over search), their median, p90 and worst,
taken both ways (``max(r, 1/r)``), beside the server's ``AGREEMENT_RATIO``: an honest pair beyond
it would refuse an honest promotion.

Run from the repository root: ``.venv/bin/python -m benchmarks.worker_agreement [--trials 8]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.http_lookup import AUTH, BENCH_TOKEN, free_port, start_server
from tiletune.service.scheduling.confirmation import AGREEMENT_RATIO

#: The keys tuned: memory-bound and compute-bound kernels, small and large.
KEYS: list[dict[str, Any]] = [
    {"kernel": "add", "shapes": [{"n": 2**16}, {"n": 2**20}]},
    {"kernel": "softmax", "shapes": [{"rows": 256, "cols": 512}, {"rows": 1024, "cols": 1024}]},
    {"kernel": "rms_norm", "shapes": [{"rows": 256, "cols": 1024}, {"rows": 1024, "cols": 2048}]},
    {"kernel": "matmul", "shapes": [{"m": 64, "n": 64, "k": 64}, {"m": 256, "n": 256, "k": 256}]},
]
DONE_WITHIN_S = 1800.0
#: What the document keeps of each job.
JOB_FIELDS = ("id", "kernel", "shape", "state", "confirmation")


def start_worker(url: str, name: str, log: Path) -> subprocess.Popen[bytes]:
    """``tiletune worker`` of this CPU, one torch thread (two workers share the two cores)."""
    env = {**os.environ, "TILETUNE_TOKEN": BENCH_TOKEN, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "tiletune.service.cli", "worker", "--server", url, "--backend", "cpu"]
    with log.open("ab") as out:
        return subprocess.Popen([*command, "--name", name], stdout=out, stderr=subprocess.STDOUT, env=env)


def wait_done(http: httpx.Client, job_ids: list[int]) -> list[dict[str, Any]]:
    """Every job once it ended (raises past :data:`DONE_WITHIN_S`)."""
    deadline = time.monotonic() + DONE_WITHIN_S
    while time.monotonic() < deadline:
        jobs = [http.get(f"/v1/jobs/{job_id}").json() for job_id in job_ids]
        if all(job["state"] in ("done", "failed", "cancelled", "skipped") for job in jobs):
            return jobs
        time.sleep(2.0)
    raise TimeoutError(f"the jobs did not end within {DONE_WITHIN_S:g} s")


def pairs_of(job: dict[str, Any], trials: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each config measured in the search by one worker and validated by another."""
    validated = {
        json.dumps(trial["config"], sort_keys=True): trial
        for trial in trials
        if trial["phase"] == "validate" and trial["median_ms"] is not None
    }
    pairs = []
    for trial in trials:
        if trial["phase"] != "search" or trial["median_ms"] is None:
            continue
        other = validated.get(json.dumps(trial["config"], sort_keys=True))
        if other is None or other["worker"] == trial["worker"]:
            continue
        ratio = other["median_ms"] / trial["median_ms"]
        pairs.append(
            {
                "job": job["id"],
                "kernel": job["kernel"],
                "shape": job["shape"],
                "config": trial["config"],
                "search_worker": trial["worker"],
                "search_ms": trial["median_ms"],
                "validation_worker": other["worker"],
                "validation_ms": other["median_ms"],
                "ratio": ratio,
            }
        )
    return pairs


def summary(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median, p90 and worst of the pairs' disagreement (``max(r, 1/r)``), and the share within the ratio."""
    spread = sorted(max(pair["ratio"], 1 / pair["ratio"]) for pair in pairs)
    if not spread:
        return {"pairs": 0}
    return {
        "pairs": len(spread),
        "median": statistics.median(spread),
        "p90": spread[min(len(spread) - 1, int(0.9 * len(spread)))],
        "worst": spread[-1],
        "within_agreement_ratio": sum(value <= AGREEMENT_RATIO for value in spread) / len(spread),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=8, help="search trials per job (default 8)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        port = free_port()
        server = start_server(f"sqlite:///{Path(folder) / 'agreement.db'}", port)
        url = f"http://127.0.0.1:{port}"
        workers = [start_worker(url, f"w{index}", Path(folder) / f"w{index}.log") for index in (1, 2)]
        try:
            with httpx.Client(base_url=url, headers=AUTH, timeout=60) as http:
                job_ids = []
                for sweep in KEYS:
                    made = http.post("/v1/sweeps", json={**sweep, "trials": args.trials})
                    made.raise_for_status()
                    job_ids += [job["id"] for job in made.json()["jobs"]]
                jobs = wait_done(http, job_ids)
                pairs = [
                    pair
                    for job in jobs
                    for pair in pairs_of(job, http.get(f"/v1/jobs/{job['id']}/trials").json())
                ]
        finally:
            for process in [*workers, server]:
                process.terminate()
                process.wait(30)
    document = {
        "benchmark": "worker_agreement",
        "command": "python -m benchmarks.worker_agreement"
        + (f" --trials {args.trials}" if args.trials != 8 else ""),
        "agreement_ratio": AGREEMENT_RATIO,
        "jobs": [{key: job.get(key) for key in JOB_FIELDS} for job in jobs],
        "pairs": pairs,
        "summary": summary(pairs),
    }
    print(json.dumps(document, indent=1))


if __name__ == "__main__":
    main()
