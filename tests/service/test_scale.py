"""At fleet scale: two servers on one PostgreSQL, four replay workers, 200 jobs, 5,000 trials, crashes.

Two ``tiletune server`` processes share one PostgreSQL database; four ``tiletune worker
--backend replay`` processes (recorded spaces as their chip, so the service's own work is all
there is) are spread over them. One sweep of 200 jobs of 26 trials (5,200). Midway, one server and a
worker of the other are SIGKILLed, then restarted. At the end the database must hold: every job
done; no job leased twice at once; every trial counted once and none lost; every job's best the
best of its validation run, and the promoted best config that same one.
"""

from __future__ import annotations

import itertools
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

from tests.credentials import ADMIN
from tiletune.service.database import aware, normalize_url

from .conftest import postgres_database
from .processes import ServerProcess, kill, log_tail, start_server, stop
from .test_crashes import CHIP, KERNEL, REPLAY_ENV, replay_worker

JOBS = 200
TRIALS = 26
TIMEOUT_S = 420.0

pytestmark = pytest.mark.slow


def measured(url: str) -> int:
    engine = create_engine(normalize_url(url))
    try:
        with engine.connect() as connection:
            query = "SELECT count(*) FROM trials WHERE state = 'measured' AND phase = 'search'"
            return int(connection.execute(text(query)).scalar_one())
    finally:
        engine.dispose()


def rows(url: str, query: str) -> list[Any]:
    engine = create_engine(normalize_url(url))
    try:
        with engine.connect() as connection:
            return list(connection.execute(text(query)))
    finally:
        engine.dispose()


def wait_until(condition: Any, what: str, logs: list[Path], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(1.0)
    raise AssertionError(f"timed out waiting until {what}:\n" + "\n".join(log_tail(p, 15) for p in logs))


def test_two_servers_and_four_workers_tune_200_jobs_through_crashes(tmp_path: Path) -> None:
    with postgres_database() as url:
        env = {**REPLAY_ENV, "TILETUNE_LEASE_S": "6"}
        servers: list[ServerProcess] = []
        workers: list[Any] = []
        try:
            for name in ("a", "b"):
                servers.append(start_server(tmp_path, db_url=url, env=env, log_name=f"server-{name}.log"))
            logs = [s.log_path for s in servers]
            for index in range(4):
                logs.append(tmp_path / f"worker-{index}.log")
                workers.append(replay_worker(servers[index % 2].url, logs[-1], "--batch", "8"))
            shapes = [{"variant": v} for v in range(1, JOBS + 1)]
            sweep: dict[str, Any] = {"kernel": KERNEL, "shapes": shapes, "trials": TRIALS, "chips": [CHIP]}
            started = time.monotonic()
            submitted = httpx.post(f"{servers[0].url}/v1/sweeps", json=sweep, headers=ADMIN, timeout=60)
            submitted.raise_for_status()

            wait_until(lambda: measured(url) >= JOBS * TRIALS // 2, "half the trials", logs, TIMEOUT_S)
            kill(servers[0].process)  # its two workers keep retrying until it is back
            kill(workers[1])  # a worker of the other server, mid-job: its lease expires
            time.sleep(1.0)
            servers[0] = start_server(
                tmp_path, db_url=url, port=servers[0].port, env=env, log_name="server-a2.log"
            )
            logs += [servers[0].log_path, tmp_path / "worker-1b.log"]
            workers[1] = replay_worker(servers[1].url, logs[-1], "--batch", "8")

            done = "SELECT count(*) FROM jobs WHERE state = 'done'"
            wait_until(lambda: rows(url, done)[0][0] == JOBS, "every job is done", logs, TIMEOUT_S)
            elapsed = time.monotonic() - started
        finally:
            for worker in workers:
                stop(worker)
            for server in servers:
                stop(server.process)
        assert_final_state(url)
        print(f"{JOBS} jobs, {JOBS * TRIALS} trials ({measured(url)} measured) in {elapsed:.0f} s")


def assert_final_state(url: str) -> None:
    """The database after the run: see the module docstring."""
    states = rows(url, "SELECT state, count(*) FROM jobs GROUP BY state")
    assert dict(states) == {"done": JOBS}

    leases: dict[int, list[tuple[Any, Any]]] = defaultdict(list)
    for job_id, created_at, ended_at in rows(url, "SELECT job_id, created_at, ended_at FROM leases"):
        assert ended_at is not None, "every lease has ended"
        leases[job_id].append((aware(created_at), aware(ended_at)))
    for job_id, spans in leases.items():
        spans.sort()
        for (_, ended), (started, _) in itertools.pairwise(spans):
            assert started >= ended, f"job {job_id} was leased twice at once"

    counted = rows(
        url,
        "SELECT j.id, j.completed, j.failed, count(t.id) FILTER (WHERE t.state = 'measured'),"
        " count(t.id) FILTER (WHERE t.state IN ('failed', 'invalid')),"
        " count(DISTINCT t.config::text) FILTER (WHERE t.state = 'measured'),"
        " count(t.id) FILTER (WHERE t.state = 'asked')"
        " FROM jobs j JOIN trials t ON t.job_id = j.id AND t.phase = 'search' GROUP BY j.id",
    )
    assert len(counted) == JOBS
    for job_id, completed, failed, measured_rows, failed_rows, distinct, held in counted:
        assert completed == measured_rows == distinct, f"job {job_id}: each trial counted once"
        assert failed == failed_rows, f"job {job_id}"
        assert completed + failed == TRIALS, f"job {job_id}: no trial lost"
        assert held == 0, f"job {job_id}: nothing left asked"

    best = rows(
        url,
        "SELECT j.id, j.best_ms, j.best_config::text, b.median_ms, b.config::text,"
        " (SELECT min(t.median_ms) FROM trials t WHERE t.job_id = j.id AND t.phase = 'validate'"
        "  AND t.state = 'validated')"
        " FROM jobs j JOIN best_configs b ON b.job_id = j.id",
    )
    assert len(best) == JOBS
    for job_id, job_ms, job_config, best_ms, best_config, validated_ms in best:
        assert job_ms == validated_ms == best_ms, f"job {job_id}: best is the best validated"
        assert job_config == best_config, f"job {job_id}"
