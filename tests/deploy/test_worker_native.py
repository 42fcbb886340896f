"""A CPU worker builds the native CPU kernels where it starts, and offers them only when they built.

Each test runs ``tiletune worker --backend cpu --once`` (a real process, as the images and units
start it) against a real server that holds a queued ``native_add`` job for this machine's chip:

- with the native build in the cache (``make setup`` made it), the worker finds it, registers the
  ``native_*`` kernels and finishes the job; nothing is compiled again;
- with an empty cache and a compiler that fails, the worker logs why, registers without the
  ``native_*`` kernels (so it leases no such job) and goes on: it exits 0 as ``--once`` asks; a
  lock left by a build killed midway does not make it wait;
- with ``--no-build-native`` and an empty cache, nothing is compiled or written, and no native job
  is leased.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.credentials import ADMIN
from tests.service.processes import ServerProcess, log_tail, serving_this_chip, start_worker
from tiletune.kernels.device import get_device
from tiletune.kernels.native.build import CACHE_ENV, build_key, cache_root, native_status
from tiletune.tuner.measure.native_prebuild import LOCK_NAME, TORCH_BUILD_LOCK

CHIP = get_device("cpu").chip.name
#: A worker's whole run: torch's import, the registration, one small job (or none).
WORKER_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A ``tiletune server`` with this machine's CPU chip registered."""
    with serving_this_chip(tmp_path_factory.mktemp("native-worker")) as process:
        yield process


def queue_native_job(server: ServerProcess, n: int) -> int:
    """A queued ``native_add`` job of ``n`` elements for this chip; its id."""
    sweep = {"kernel": "native_add", "shapes": [{"n": n}], "chips": [CHIP], "trials": 3, "validate_top": 1}
    created = httpx.post(f"{server.url}/v1/sweeps", json=sweep, headers=ADMIN, timeout=30)
    assert created.status_code == 201, created.text
    (job,) = created.json()["jobs"]
    return int(job["id"])


def job_state(server: ServerProcess, job_id: int) -> str:
    answer = httpx.get(f"{server.url}/v1/jobs/{job_id}", headers=ADMIN, timeout=30)
    assert answer.status_code == 200, answer.text
    return str(answer.json()["state"])


def cancel(server: ServerProcess, job_id: int) -> None:
    httpx.post(f"{server.url}/v1/jobs/{job_id}/cancel", headers=ADMIN, timeout=30)


def run_worker(server: ServerProcess, log: Path, *args: str, env: dict[str, str]) -> str:
    """``tiletune worker --backend cpu --once ARGS`` to its end (exit 0 required); its log."""
    process = start_worker(server.url, log, args=("--once", *args), env=env)
    try:
        status = process.wait(WORKER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise AssertionError(f"the worker did not exit:\n{log_tail(log)}") from None
    assert status == 0, log_tail(log)
    return log.read_text(errors="replace")


def test_a_worker_finds_the_build_and_runs_native_jobs(server: ServerProcess, tmp_path: Path) -> None:
    if not native_status().available:
        pytest.skip(f"the native build is not in the cache here ({native_status().reason})")
    job_id = queue_native_job(server, 4096)
    built = sorted(cache_root().rglob("*.so"))

    log = run_worker(server, tmp_path / "worker.log", env={CACHE_ENV: str(cache_root())})

    assert "native CPU kernels ready" in log, log
    assert job_state(server, job_id) == "done", log
    assert sorted(cache_root().rglob("*.so")) == built  # found, not rebuilt


def test_a_failed_build_is_logged_and_the_worker_goes_on_without_native(
    server: ServerProcess, tmp_path: Path
) -> None:
    """Also: the lock file torch leaves in a build directory when a build is killed midway is
    cleared (under the cache's own lock), else this build would wait for it for ever."""
    job_id = queue_native_job(server, 8192)
    cache = tmp_path / "native"
    abandoned = cache / build_key() / TORCH_BUILD_LOCK
    abandoned.parent.mkdir(parents=True)
    abandoned.write_text("")
    broken = {CACHE_ENV: str(cache), "CXX": "/bin/false"}  # a compiler that fails every call
    try:
        log = run_worker(server, tmp_path / "worker.log", env=broken)
        assert "stopped midway" in log, log
        assert not abandoned.exists()
        assert "native CPU kernels unavailable" in log
        assert "without the native_* kernels" in log
        assert "no job for this chip" in log  # registered, leased nothing it cannot run
        assert job_state(server, job_id) == "queued"
        assert not list(cache.rglob("*.so"))
        assert (cache / LOCK_NAME).exists()  # builders sharing the cache take turns on this lock
    finally:
        cancel(server, job_id)


def test_no_build_native_compiles_nothing(server: ServerProcess, tmp_path: Path) -> None:
    job_id = queue_native_job(server, 16384)
    cache = tmp_path / "native"
    try:
        log = run_worker(server, tmp_path / "worker.log", "--no-build-native", env={CACHE_ENV: str(cache)})
        assert "native CPU kernels" not in log
        assert "no job for this chip" in log
        assert job_state(server, job_id) == "queued"
        assert not cache.exists()
    finally:
        cancel(server, job_id)
