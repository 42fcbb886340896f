"""The backend a job runs, with real ``tiletune server`` and ``tiletune worker`` processes, on SQLite
and PostgreSQL: each job runs the best implementation the worker that leases it has.

The server runs where the native kernels are not built (``$TILETUNE_NATIVE_DIR`` an empty folder):
a sweep naming ``native`` is still accepted, since what a kernel declares never depends on the
server's machine. A worker without the native build runs a sweep that names no backend on
``torch`` and passes the job naming ``native`` by; a worker with it runs that one, and a later
sweep naming none, on ``native``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.credentials import ADMIN
from tiletune.kernels.native.build import CACHE_ENV, native_status

from .processes import log_tail, start_server, start_worker, stop

TIMEOUT_S = 180.0
SHAPES = {"add": {"n": 4096}, "softmax": {"rows": 16, "cols": 256}}


def submit(url: str, kernel: str, **fields: Any) -> int:
    sweep = {"kernel": kernel, "shapes": [SHAPES[kernel]], "trials": 3, "validate_top": 1, **fields}
    response = httpx.post(f"{url}/v1/sweeps", json=sweep, headers=ADMIN, timeout=10)
    assert response.status_code == 201, response.text
    job_id: int = response.json()["jobs"][0]["id"]
    return job_id


def job(url: str, job_id: int) -> dict[str, Any]:
    found: dict[str, Any] = httpx.get(f"{url}/v1/jobs/{job_id}", timeout=10).json()
    return found


def measured(url: str, job_id: int) -> int:
    trials = httpx.get(f"{url}/v1/jobs/{job_id}/trials", timeout=10).json()
    return sum(1 for trial in trials if trial["phase"] == "search" and trial["state"] == "measured")


def work_once(url: str, log: Path, env: dict[str, str] | None = None) -> None:
    """A ``tiletune worker --once`` run to its end: it works every job it may lease, then exits.

    With ``env`` pointing at an empty native cache the worker must stay without the native kernels,
    so it does not build them at start (``--no-build-native``)."""
    build = ["--no-build-native"] if env is not None and CACHE_ENV in env else []
    worker = start_worker(url, log, args=["--once", "--batch", "2", *build], env=env)
    deadline = time.monotonic() + TIMEOUT_S
    while worker.poll() is None and time.monotonic() < deadline:
        time.sleep(0.3)
    assert stop(worker) == 0, log_tail(log)


@pytest.mark.slow
@pytest.mark.skipif(not native_status().available, reason="the native kernels are not built here")
def test_each_job_runs_the_best_backend_of_the_worker_that_leases_it(
    tmp_path: Path, database_url: str
) -> None:
    unbuilt = {CACHE_ENV: str(tmp_path / "no-native-build")}
    server = start_server(tmp_path, db_url=database_url, env=unbuilt)
    try:
        unnamed = submit(server.url, "add")
        named = submit(server.url, "softmax", backend="native")
        assert (job(server.url, unnamed)["backend"], job(server.url, named)["backend"]) == ("*", "native")

        work_once(server.url, tmp_path / "portable.log", env=unbuilt)
        done = job(server.url, unnamed)
        assert (done["state"], done["backend"]) == ("done", "torch"), log_tail(tmp_path / "portable.log")
        assert measured(server.url, unnamed) == 3
        waiting = job(server.url, named)
        assert (waiting["state"], waiting["backend"], waiting["lease_failures"]) == ("queued", "native", 0)

        later = submit(server.url, "add", dtypes=["float16"])
        work_once(server.url, tmp_path / "native.log")
        for job_id in (named, later):
            found = job(server.url, job_id)
            assert (found["state"], found["backend"]) == ("done", "native"), log_tail(tmp_path / "native.log")
            assert measured(server.url, job_id) == 3
            assert found["progress"]["best_ms"] > 0
    finally:
        stop(server.process)
