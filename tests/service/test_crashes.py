"""Crashes at the seams, a torn store tail, a database outage, a job the server fails on: nothing is lost.

Real ``tiletune server`` and ``tiletune worker --backend replay`` processes (recorded spaces as
their chip: no kernels run, so each trial costs the service alone). A server crashes exactly at
a seam through its fail points (:mod:`tiletune.service.failpoints`: SIGKILL of itself there);
each test then asserts the database's final state: every job done (or failed as intended),
every measured trial counted once, every promoted best equal to the best its job validated.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

from tests.credentials import ADMIN
from tiletune.kernels.replay.declaration import REPLAY_KERNELS_ENV
from tiletune.service.database import normalize_url

from .conftest import POSTGRES_ADMIN_URL, postgres_database
from .processes import ServerProcess, kill, start_server, start_worker, stop
from .test_faults import jobs, trials, wait_until

REPLAY_DIR = Path(__file__).parent.parent / "data" / "replay"
KERNEL = "replay_pnpoly_RTX_3090"
CHIP = "replay/recorded"
REPLAY_ENV = {REPLAY_KERNELS_ENV: str(REPLAY_DIR)}

pytestmark = pytest.mark.slow


def server(folder: Path, *, failpoints: str = "", **kwargs: Any) -> ServerProcess:
    env = {**REPLAY_ENV, "TILETUNE_FAILPOINTS": failpoints, **kwargs.pop("env", {})}
    return start_server(folder, env=env, **kwargs)


def replay_worker(url: str, log: Path, *args: str) -> Any:
    return start_worker(url, log, args=["--backend", "replay", *args], env=REPLAY_ENV)


def submit(url: str, variants: int, trials: int) -> list[int]:
    sweep = {"kernel": KERNEL, "shapes": [{"variant": v} for v in range(1, variants + 1)], "trials": trials}
    sweep["chips"] = [CHIP]
    response = httpx.post(f"{url}/v1/sweeps", json=sweep, headers=ADMIN, timeout=30)
    response.raise_for_status()
    return [job["id"] for job in response.json()["jobs"]]


def wait_for_death(server: ServerProcess, timeout_s: float = 90.0) -> None:
    """The server killed itself at its fail point."""
    deadline = time.monotonic() + timeout_s
    while server.process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert server.process.poll() is not None, f"the server did not reach its fail point:\n{server.log()}"


def restart(folder: Path, crashed: ServerProcess, log_name: str, **kwargs: Any) -> ServerProcess:
    return server(folder, db_url=crashed.db_url, port=crashed.port, log_name=log_name, **kwargs)


def assert_intact(url: str, expected_trials: int | None = None) -> None:
    """Every job done; measured trials counted once, no config twice; promoted bests as validated."""
    bundle = httpx.get(f"{url}/v1/configs", params={"chip": CHIP, "kernel": KERNEL}, timeout=30).json()
    best = {entry["shape_key"]: entry for entry in bundle["configs"]}
    for job in jobs(url):
        assert job["state"] == "done", job
        rows = trials(url, job["id"])
        measured = [t for t in rows if t["phase"] == "search" and t["state"] == "measured"]
        assert len(measured) == job["progress"]["completed"]
        if expected_trials is not None:
            assert job["progress"]["completed"] == expected_trials
        configs = Counter(tuple(sorted(t["config"].items())) for t in measured)
        assert max(configs.values()) == 1, configs
        assert not [t for t in rows if t["state"] == "asked"], "nothing is left held"
        validated = [t for t in rows if t["phase"] == "validate" and t["state"] == "validated"]
        fastest = min(validated, key=lambda t: t["median_ms"])
        assert job["progress"]["best_ms"] == fastest["median_ms"]
        entry = best[job["shape_key"]]
        assert entry["job_id"] == job["id"]
        assert entry["config"] == fastest["config"]
        assert entry["median_ms"] == fastest["median_ms"]


def test_a_server_killed_after_the_reapers_commit_leaves_no_trial_held(tmp_path: Path) -> None:
    """A worker killed mid-trial; its lease expires; the server dies between ending the lease and
    abandoning its trials. After a restart the trials are asked again, not waited on forever."""
    first = server(tmp_path, failpoints="reap.committed=kill")
    logs = [first.log_path, tmp_path / "w1.log", tmp_path / "w2.log", tmp_path / "server2.log"]
    worker = replay_worker(first.url, logs[1], "--replay-trial-ms", "200")
    second_worker = again = None
    try:
        submit(first.url, variants=1, trials=12)
        wait_until(lambda: jobs(first.url)[0]["progress"]["completed"] >= 2, "2 trials", logs)
        kill(worker)  # mid-trial: its outstanding trials stay asked under a lease that expires
        wait_for_death(first)
        again = restart(tmp_path, first, "server2.log")
        second_worker = replay_worker(again.url, logs[2])
        wait_until(lambda: jobs(again.url)[0]["state"] == "done", "the job is done", logs)
        (job,) = jobs(again.url)
        assert job["lease_failures"] == 1
        assert_intact(again.url, expected_trials=12)
        assert "abandoned" in {t["state"] for t in trials(again.url, job["id"])}
    finally:
        for process in (worker, second_worker):
            if process is not None:
                stop(process)
        stop((again or first).process)


@pytest.mark.parametrize("seam", ["tell.searched=kill@6", "complete.promoted=kill@2"])
def test_a_server_killed_at_a_seam_loses_nothing(tmp_path: Path, seam: str) -> None:
    """Between the search's record and ours (a tell), or mid-promotion: one transaction each."""
    first = server(tmp_path, failpoints=seam, env={"TILETUNE_LEASE_S": "30"})
    logs = [first.log_path, tmp_path / "worker.log", tmp_path / "server2.log"]
    worker = replay_worker(first.url, logs[1])
    again = None
    try:
        submit(first.url, variants=3, trials=8)
        wait_for_death(first)
        again = restart(tmp_path, first, "server2.log", env={"TILETUNE_LEASE_S": "30"})
        wait_until(lambda: all(j["state"] == "done" for j in jobs(again.url)), "every job is done", logs)
        assert_intact(again.url, expected_trials=8)
    finally:
        stop(worker)
        stop((again or first).process)


def test_a_torn_store_tail_never_stops_the_server(tmp_path: Path) -> None:
    """Killed mid-sweep; the SQLite WAL then ends in a torn frame, and an Optuna journal of an
    earlier release ends in a torn line: the server starts, and every job completes."""
    first = server(tmp_path)
    logs = [first.log_path, tmp_path / "worker.log", tmp_path / "server2.log"]
    worker = replay_worker(first.url, logs[1])
    again = None
    try:
        submit(first.url, variants=2, trials=10)
        wait_until(lambda: sum(j["progress"]["completed"] for j in jobs(first.url)) >= 4, "4 trials", logs)
        kill(first.process)
        wal = tmp_path / "t.db-wal"
        assert wal.exists(), "a killed SQLite process leaves its write-ahead log behind"
        with wal.open("ab") as tail:
            tail.write(b"\x37\x7f\x06\x82" + b"\x00torn frame" * 50)
        (tmp_path / "t.optuna.log").write_text(
            '{"op_code": 0, "worker_id": "x", "study_name": "job-1"}\n{"op_co'
        )
        again = restart(tmp_path, first, "server2.log")
        wait_until(lambda: all(j["state"] == "done" for j in jobs(again.url)), "every job is done", logs)
        assert_intact(again.url, expected_trials=10)
    finally:
        stop(worker)
        stop((again or first).process)


def test_a_job_whose_asks_fail_ends_failed_and_the_worker_goes_on(tmp_path: Path) -> None:
    """Every ask of job 1 answers 500: its worker gives it up after a few tries, three times,
    so it ends ``failed`` with the server's message; the worker tunes job 2 meanwhile."""
    live = server(tmp_path, failpoints="ask.start:1=error")
    logs = [live.log_path, tmp_path / "worker.log"]
    worker = replay_worker(live.url, logs[1])
    try:
        submit(live.url, variants=2, trials=6)
        finished = {"done", "failed"}
        wait_until(lambda: {j["state"] for j in jobs(live.url)} <= finished, "both jobs end", logs)
        failing, other = sorted(jobs(live.url), key=lambda j: j["id"])
        assert failing["state"] == "failed"
        assert failing["lease_failures"] == 3
        for reason in failing["failure_reasons"]:
            assert reason.startswith("the server failed on this job 5 times in a row"), reason
            assert "internal error (FailPointError)" in reason
        assert other["state"] == "done"
        assert worker.poll() is None, "the worker is still running"
    finally:
        stop(worker)
        stop(live.process)


def test_the_database_going_away_under_load_answers_503_and_loses_nothing(tmp_path: Path) -> None:
    """PostgreSQL refuses the server's database for a few seconds (connections terminated,
    new ones refused: ``ALLOW_CONNECTIONS false``); requests get 503 with Retry-After; the
    server and the workers carry on when it returns, without a restart."""
    admin = create_engine(normalize_url(POSTGRES_ADMIN_URL), isolation_level="AUTOCOMMIT")
    with postgres_database() as url:
        name = url.rsplit("/", 1)[1]
        live = server(tmp_path, db_url=url, env={"TILETUNE_LEASE_S": "30"})
        logs = [live.log_path, tmp_path / "w1.log", tmp_path / "w2.log"]
        workers = [
            replay_worker(live.url, logs[1], "--replay-trial-ms", "20"),
            replay_worker(live.url, logs[2]),
        ]
        try:
            submit(live.url, variants=4, trials=10)
            wait_until(lambda: sum(j["progress"]["completed"] for j in jobs(live.url)) >= 6, "6 trials", logs)
            with admin.connect() as connection:
                connection.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false'))
                connection.execute(
                    text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :name"),
                    {"name": name},
                )
            down = httpx.get(f"{live.url}/healthz", timeout=30)
            assert down.status_code == 503
            assert down.json()["code"] == "database_unavailable"
            assert int(down.headers["Retry-After"]) >= 1
            time.sleep(3.0)
            with admin.connect() as connection:
                connection.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true'))
            wait_until(lambda: all(j["state"] == "done" for j in jobs(live.url)), "every job is done", logs)
            assert_intact(live.url, expected_trials=10)
            assert live.process.poll() is None, "the server never restarted"
            assert all(worker.poll() is None for worker in workers)
        finally:
            for worker in workers:
                stop(worker)
            stop(live.process)
    admin.dispose()
