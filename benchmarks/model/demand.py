"""The service's demand path, end to end, for the keys a model's run missed.

1. :func:`tuning_server`: a ``tiletune server`` process on a fresh SQLite file, with a fresh admin
   token, demand on from the first report of a key (``TILETUNE_MISS_QUEUE_THRESHOLD=1``), ``trials``
   per demand job (``TILETUNE_MISS_TRIALS``) and a budget of demand jobs no model here exceeds;
2. :func:`register_this_chip`: this machine's CPU chip registered (demand tunes registered chips
   only), as a worker registers it;
3. the caller runs its model on a ``ConfigClient`` of the server, then :func:`report_misses`: the
   client reports the keys it answered with a default or a nearest config (``POST /misses``),
   and the server queues one ``demand`` job per key;
4. :func:`run_worker`: ``tiletune worker --backend cpu --once`` until no job is left;
5. :func:`job_summary`: what the jobs ended as (state, trials, speedup over the default).

Every process is stopped when its block ends, whatever happened inside.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks.http_lookup import free_port
from tiletune.client import ConfigClient
from tiletune.client.space import is_vendor
from tiletune.kernels.defaults import client_settings
from tiletune.tuner.measure.worker import Worker

#: ``tiletune`` as a command of this interpreter (the console script's module).
TILETUNE = (sys.executable, "-m", "tiletune.service.cli")
#: Seconds a server has to answer ``/healthz`` (imports and migrations on a busy machine).
START_TIMEOUT_S = 90.0
#: Seconds the server has to queue the demand jobs of a report.
QUEUE_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class TuningServer:
    """A running server: its URL, admin token and log."""

    url: str
    token: str
    log_path: Path

    @property
    def headers(self) -> dict[str, str]:
        """The admin's request headers."""
        return {"Authorization": f"Bearer {self.token}"}

    def http(self) -> httpx.Client:
        """A client of the server's API, as the admin."""
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=30)


def _wait_healthy(url: str, process: subprocess.Popen[bytes], log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}: see {log_path}")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url}/healthz did not answer within {START_TIMEOUT_S:g} s: see {log_path}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 30 s."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def tuning_server(folder: Path, trials: int) -> Iterator[TuningServer]:
    """A ``tiletune server`` on ``folder/model_step.db`` whose demand jobs run ``trials`` trials."""
    token = "tt_" + secrets.token_urlsafe(32)
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TILETUNE_")},
        "TILETUNE_ADMIN_TOKEN": token,
        "TILETUNE_MISS_QUEUE_THRESHOLD": "1",
        "TILETUNE_MISS_TRIALS": str(trials),
        "TILETUNE_DEMAND_JOBS_PER_CHIP_HOUR": "1000",
        "TILETUNE_MISS_REPORTS_PER_S": "100",
    }
    log_path = folder / "server.log"
    command = [*TILETUNE, "server", "--db", f"sqlite:///{folder / 'model_step.db'}", "--port", str(port)]
    with log_path.open("ab") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url, process, log_path)
        yield TuningServer(url=url, token=token, log_path=log_path)
    finally:
        _stop(process)


def register_this_chip(server: TuningServer) -> str:
    """Register this machine's CPU chip, as a CPU worker does; the chip's name."""
    with server.http() as http:
        worker = Worker(http, backend="cpu", name="model-step-registration")
        worker.register()
        name: str = worker.device.chip.name
        worker.close()
    return name


def tuning_client(server: TuningServer) -> ConfigClient:
    """A ``ConfigClient`` of the server for this chip, the kernels' rules as its defaults, no disk
    cache (a run starts from nothing) and lookups that may wait 2 s on a busy machine."""
    settings = client_settings(cache_dir=None, timeout_s=2.0)
    return ConfigClient(server.url, chip="auto", token=server.token, settings=settings)


def report_misses(client: ConfigClient, server: TuningServer) -> list[dict[str, Any]]:
    """Report the client's misses and wait until the server has queued their demand jobs; the jobs."""
    if not client.flush_misses():
        raise RuntimeError(f"the miss report failed: see {server.log_path}")
    with server.http() as http:
        reported = http.get("/v1/misses", params={"limit": 1000}).json()
        deadline = time.monotonic() + QUEUE_TIMEOUT_S
        while True:
            jobs: list[dict[str, Any]] = http.get("/v1/jobs", params={"limit": 1000}).json()
            if len(jobs) >= len(reported) or time.monotonic() > deadline:
                return jobs
            time.sleep(0.5)


def run_worker(server: TuningServer, folder: Path, timeout_s: float) -> float:
    """``tiletune worker --backend cpu --once`` until it has no job left (stopped after ``timeout_s``);
    its wall seconds."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TILETUNE_")},
        "TILETUNE_TOKEN": server.token,
    }
    command = [
        *TILETUNE,
        "worker",
        "--server",
        server.url,
        "--backend",
        "cpu",
        "--once",
        "--name",
        "model-step",
    ]
    started = time.perf_counter()
    with (folder / "worker.log").open("ab") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        print(f"model_step: the worker ran past {timeout_s:g} s; stopped", file=sys.stderr)
    finally:
        _stop(process)
    return time.perf_counter() - started


def job_summary(server: TuningServer) -> dict[str, Any]:
    """The demand jobs: how many per state and kernel, trials run, how many chose torch's op, and each
    job's speedup over the default config (its best time against the default's, as the worker
    measured them) and what its answer runs (``vendor``: torch's op; else the job's backend)."""
    with server.http() as http:
        jobs: list[dict[str, Any]] = http.get("/v1/jobs", params={"limit": 1000}).json()
    return {
        "jobs": len(jobs),
        "states": dict(Counter(job["state"] for job in jobs)),
        "kernels": dict(Counter(job["kernel"] for job in jobs)),
        "trials_completed": sum(job["progress"]["completed"] for job in jobs),
        "chose_vendor": sum(is_vendor(job["progress"]["best_config"]) for job in jobs),
        "per_job": [
            {
                "kernel": job["kernel"],
                "shape": job["shape_key"],
                "state": job["state"],
                "backend": job["backend"],
                "implementation": "vendor" if is_vendor(job["progress"]["best_config"]) else job["backend"],
                "completed": job["progress"]["completed"],
                "speedup_vs_default": job["progress"]["speedup_vs_default"],
            }
            for job in jobs
        ],
    }
