"""What a replay worker costs per trial: the lookup path in process, and a worker process's CPU.

Two figures (JSON on stdout):

- ``lookup``: the worker's per-trial work on a replay device, in process, no server: the
  task's config checked against the kernel's space (``parse_config``), the bench's
  ``evaluate`` (a lookup), the wire outcome (``outcome_of``) and its JSON body, over
  ``--configs`` recorded configs of ``--kernel``'s recording at variant 2 (perturbed
  times); also one validation run of 4 configs (``validated_results``). Median of
  ``--repeats`` passes, in microseconds per trial.
- ``service`` (unless ``--no-service``): a real ``tiletune server`` process (SQLite in a
  temporary folder) and one ``tiletune worker --backend replay --batch B`` process; a sweep of
  ``--jobs`` variants x ``--trials`` trials from submission until every job is ``done``. The
  CPU time (user + system, from ``/proc``) each process spent in that window, per trial
  told, and the wall time: the worker's figure is its HTTP client, heartbeats and lookups;
  the server's is everything the service does per trial (search, writes, validation).

Run from the repository root: ``.venv/bin/python -m benchmarks.replay_worker_cost``
(``--jobs 20 --trials 25``). Uses the bundled recording (``tests/data/replay``) unless
``--replay-dir`` names another directory.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.http_lookup import free_port
from tiletune.kernels.device import REPLAY_CHIP, ReplayDevice
from tiletune.kernels.replay.declaration import REPLAY_KERNELS_ENV, variant_sweep
from tiletune.kernels.replay.spec import ReplayKernelSpec, replay_kernels
from tiletune.tuner.measure.replay_bench import ReplayBench
from tiletune.tuner.measure.result import outcome_of, validated_results

BUNDLED = Path(__file__).resolve().parents[1] / "tests" / "data" / "replay"
TOKEN = "tt_replay-bench-admin-token-0123456789abcdefghijk"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TICKS = os.sysconf("SC_CLK_TCK")


def lookup_cost(spec: ReplayKernelSpec, configs: int, repeats: int) -> dict[str, Any]:
    """Microseconds per trial of the worker's measurement path (see the module docstring)."""
    shape = {"variant": 2}
    bench = ReplayBench(spec, shape, "float32", ReplayDevice())
    recording = spec.recording
    keys = random.Random(0).sample(sorted(recording.entries), min(configs, len(recording.entries)))
    tasks = [dict(zip(recording.knobs, key, strict=True)) for key in keys]
    passes = []
    for _ in range(repeats):
        started = time.perf_counter_ns()
        for trial_id, task in enumerate(tasks):
            config = spec.parse_config(task, shape)
            outcome = outcome_of(trial_id, bench.evaluate(config, 1.0))
            outcome.model_dump_json()
        passes.append((time.perf_counter_ns() - started) / len(tasks) / 1e3)
    validation = []
    for _ in range(repeats):
        started = time.perf_counter_ns()
        validated_results(bench, tasks[:4])
        validation.append((time.perf_counter_ns() - started) / 1e3)
    return {
        "kernel": spec.name,
        "configs": len(tasks),
        "repeats": repeats,
        "us_per_trial_median": round(statistics.median(passes), 2),
        "us_per_trial_min": round(min(passes), 2),
        "us_per_validation_of_4_median": round(statistics.median(validation), 1),
    }


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def spawn(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("ab") as stream:
        return subprocess.Popen(
            [sys.executable, "-m", "tiletune.service.cli", *args],
            stdout=stream,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )


def wait(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"timed out waiting until {what}")


def service_cost(  # noqa: PLR0917 (the command line, in order)
    spec: ReplayKernelSpec, directory: Path, jobs: int, trials: int, batch: int, workers: int = 1
) -> dict[str, Any]:
    """CPU per trial of a replay worker process and of the server process (see the module docstring)."""
    env = {
        **os.environ,
        REPLAY_KERNELS_ENV: str(directory),
        "TILETUNE_ADMIN_TOKEN": TOKEN,
        "TILETUNE_TOKEN": TOKEN,
        "OMP_NUM_THREADS": "1",
    }
    with tempfile.TemporaryDirectory() as folder:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        server = spawn(
            ["server", "--db", f"sqlite:///{folder}/t.db", "--port", str(port)], Path(folder) / "s.log", env
        )
        started_workers: list[subprocess.Popen[bytes]] = []
        try:
            wait(lambda: httpx.get(f"{url}/healthz", timeout=1).status_code == 200, 90, "the server answers")
            for index in range(workers):
                command = ["worker", "--server", url, "--backend", "replay", "--batch", str(batch)]
                started_workers.append(spawn(command, Path(folder) / f"w{index}.log", env))
            wait(
                lambda: len(httpx.get(f"{url}/v1/workers", headers=AUTH, timeout=5).json()) >= workers,
                90,
                "the workers register",
            )
            time.sleep(1.5)  # let the workers finish their start-up work and go idle
            before = (sum(cpu_s(w.pid) for w in started_workers), cpu_s(server.pid))
            started = time.monotonic()
            sweep = variant_sweep(spec.name, jobs, trials=trials, chip=REPLAY_CHIP.name)
            httpx.post(f"{url}/v1/sweeps", json=sweep, headers=AUTH, timeout=30).raise_for_status()

            def finished() -> bool:
                states = [
                    job["state"] for job in httpx.get(f"{url}/v1/jobs", headers=AUTH, timeout=10).json()
                ]
                return len(states) == jobs and all(state == "done" for state in states)

            wait(finished, 1800, "every job is done")
            wall_s = time.monotonic() - started
            worker_cpu = sum(cpu_s(w.pid) for w in started_workers) - before[0]
            server_cpu = cpu_s(server.pid) - before[1]
            told = sum(
                job["progress"]["completed"] + job["progress"]["failed"]
                for job in httpx.get(f"{url}/v1/jobs", headers=AUTH, timeout=10).json()
            )
        finally:
            for process in (*started_workers, server):
                process.terminate()
                process.wait(30)
    return {
        "jobs": jobs,
        "trials_per_job": trials,
        "batch": batch,
        "workers": workers,
        "trials_told": told,
        "wall_s": round(wall_s, 2),
        "trials_per_s": round(told / wall_s, 1),
        "worker_cpu_ms_per_trial": round(1e3 * worker_cpu / told, 3),
        "server_cpu_ms_per_trial": round(1e3 * server_cpu / told, 3),
        "note": "CPU from /proc (10 ms ticks) over submission..all done; includes each job's validation run",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replay-dir", type=Path, default=BUNDLED)
    parser.add_argument("--kernel", default="replay_pnpoly_RTX_3090")
    parser.add_argument("--configs", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--trials", type=int, default=25)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--workers", type=int, default=1, help="replay worker processes (default 1)")
    parser.add_argument("--no-service", action="store_true", help="the in-process lookup figure only")
    args = parser.parse_args()
    spec = replay_kernels(args.replay_dir)[args.kernel]
    report: dict[str, Any] = {
        "benchmark": "replay_worker_cost",
        "lookup": lookup_cost(spec, args.configs, args.repeats),
    }
    if not args.no_service:
        report["service"] = service_cost(
            spec, args.replay_dir, args.jobs, args.trials, args.batch, args.workers
        )
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
