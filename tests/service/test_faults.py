"""Faults with real processes: a worker killed mid-job, a server killed mid-sweep. Nothing is lost.

Server and workers are ``tiletune`` processes (:mod:`tests.service.processes`)
with leases of 4 s, so a dead worker's job returns to the queue within seconds.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.credentials import ADMIN

from .processes import kill, log_tail, start_server, start_worker, stop

TIMEOUT_S = 150.0


def jobs(url: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{url}/v1/jobs", timeout=10)
    response.raise_for_status()
    found: list[dict[str, Any]] = response.json()
    return found


def trials(url: str, job_id: int) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = httpx.get(f"{url}/v1/jobs/{job_id}/trials", timeout=10).json()
    return found


def submit(url: str, shapes: list[dict[str, int]], trials: int) -> None:
    sweep = {"kernel": "add", "shapes": shapes, "trials": trials}
    httpx.post(f"{url}/v1/sweeps", json=sweep, headers=ADMIN, timeout=10).raise_for_status()


def wait_until(condition: Any, what: str, logs: list[Path], timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting until {what}:\n" + "\n".join(log_tail(p, 20) for p in logs))


def assert_counted_once(url: str, job: dict[str, Any]) -> None:
    """Every measured search trial is counted once in the job's progress, no config measured twice."""
    measured = [t for t in trials(url, job["id"]) if t["phase"] == "search" and t["state"] == "measured"]
    assert len(measured) == job["progress"]["completed"]
    configs = Counter(tuple(sorted(t["config"].items())) for t in measured)
    assert max(configs.values()) == 1, configs
    assert len({t["number"] for t in measured}) == len(measured)


@pytest.mark.slow
def test_a_worker_killed_mid_job_loses_nothing_and_another_finishes_the_job(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    logs = [server.log_path, tmp_path / "first.log", tmp_path / "second.log"]
    first = start_worker(server.url, logs[1])
    second = None
    try:
        submit(server.url, [{"n": 262144}], trials=24)
        wait_until(lambda: jobs(server.url)[0]["progress"]["completed"] >= 4, "4 trials are measured", logs)
        kill(first)
        second = start_worker(server.url, logs[2])
        wait_until(lambda: jobs(server.url)[0]["state"] == "done", "the job is done", logs)
        (job,) = jobs(server.url)
        assert job["lease_failures"] == 1
        assert "expired" in job["failure_reasons"][0]
        assert job["progress"]["completed"] == 24
        assert_counted_once(server.url, job)
    finally:
        for worker in (first, second):
            if worker is not None:
                stop(worker)
        stop(server.process)


@pytest.mark.slow
def test_a_server_killed_mid_sweep_loses_nothing(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    logs = [server.log_path, tmp_path / "worker.log", tmp_path / "server2.log"]
    worker = start_worker(server.url, logs[1])
    try:
        submit(server.url, [{"n": 65536}, {"n": 131072}, {"n": 262144}], trials=10)
        wait_until(lambda: sum(j["progress"]["completed"] for j in jobs(server.url)) >= 6, "6 trials", logs)
        before = {j["id"]: j["progress"]["completed"] for j in jobs(server.url)}
        kill(server.process)
        time.sleep(1.0)
        server = start_server(tmp_path, db_url=server.db_url, port=server.port, log_name="server2.log")
        after_restart = {j["id"]: j["progress"]["completed"] for j in jobs(server.url)}
        assert all(after_restart[job_id] >= count for job_id, count in before.items())
        wait_until(lambda: all(j["state"] == "done" for j in jobs(server.url)), "every job is done", logs)
        for job in jobs(server.url):
            assert job["progress"]["completed"] == 10
            assert_counted_once(server.url, job)
        bundle = httpx.get(f"{server.url}/v1/configs", params={"chip": jobs(server.url)[0]["chip"]}).json()
        assert len(bundle["configs"]) == 3
    finally:
        stop(worker)
        stop(server.process)
