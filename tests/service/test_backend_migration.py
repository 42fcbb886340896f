"""Revision 0010 over a store in use, on SQLite and PostgreSQL: ``jobs.backend`` becomes nullable in
place while leases and trials refer to the jobs; jobs never leased, of sweeps that named no backend,
get none (their first lease chooses); every other job keeps its backend; downgrade gives the jobs
without one the previous release's default."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import MetaData, Table, select

from tiletune.service.database import make_engine
from tiletune.service.migrate import current_revision, downgrade, drift, upgrade

NOW = datetime(2026, 12, 1, tzinfo=UTC)
SHAPE = {"n": 4096}


def _job(job_id: int, sweep_id: int, kernel: str, backend: str, state: str = "queued") -> dict[str, Any]:
    return {
        "id": job_id,
        "sweep_id": sweep_id,
        "kernel": kernel,
        "kernel_version": 1,
        "shape": SHAPE,
        "shape_key": "n=4096",
        "dtype": "float32",
        "chip_target": "*",
        "backend": backend,
        "strategy": "tpe",
        "trials": 4,
        "seed": 0,
        "workers_per_job": 1,
        "validate_top": 3,
        "force": False,
        "state": state,
        "active_leases": 0,
        "lease_failures": 0,
        "failure_reasons": [],
        "completed": 0,
        "invalid": 0,
        "failed": 0,
        "created_at": NOW,
        "updated_at": NOW,
    }


def _fill_at_0009(url: str) -> None:
    """Sweeps with and without a backend, jobs leased and not, a trial under a lease (at 0009)."""
    engine = make_engine(url)
    try:
        meta = MetaData()
        tables = {name: Table(name, meta, autoload_with=engine) for name in MIGRATED_TABLES}
        request_none = {"kernel": "add", "shapes": [SHAPE], "backend": None}
        rows: list[tuple[str, list[dict[str, Any]]]] = [
            ("chips", [{"id": 1, "name": "cpu/x", "kind": "cpu", "local_memory_bytes": 1 << 20,
                        "max_buffer_num": 4, "alignment_bytes": 32, "created_at": NOW, "updated_at": NOW}]),
            ("software", [{"id": 1, "chip_id": 1, "fingerprint": "{}", "first_seen_at": NOW}]),
            ("workers", [{"id": 1, "name": "w", "chip_id": 1, "software_id": 1, "backends": ["torch"],
                          "kernels": [], "registered_at": NOW, "last_seen_at": NOW}]),
            ("sweeps", [
                {"id": 1, "name": None, "kernels": ["add"], "request": request_none, "created_at": NOW},
                {"id": 2, "name": None, "kernels": ["add"], "request": {**request_none, "backend": "torch"},
                 "created_at": NOW},
            ]),
            ("jobs", [
                _job(1, 1, "add", "torch"),  # never leased, no backend named: unchosen
                _job(2, 1, "add", "torch"),  # leased once (its trials are torch's): kept
                _job(3, 2, "add", "torch"),  # its sweep named torch: kept
                _job(4, 1, "add", "torch", state="done"),  # finished: kept
                _job(5, 1, "native_add", "native"),  # never leased: unchosen
            ]),
            ("leases", [{"id": 1, "token": "t", "job_id": 2, "worker_id": 1, "created_at": NOW,
                         "expires_at": NOW, "ended_at": NOW, "end_reason": "released"}]),
            ("trials", [{"id": 1, "job_id": 2, "number": 0, "lease_id": 1, "phase": "search",
                         "config": {"tile_size": 64}, "state": "measured", "pruned": False,
                         "asked_at": NOW}]),
        ]  # fmt: skip
        with engine.begin() as connection:
            for table, values in rows:
                connection.execute(tables[table].insert(), values)
    finally:
        engine.dispose()


MIGRATED_TABLES = ("chips", "software", "workers", "sweeps", "jobs", "leases", "trials")


def _backends(url: str) -> dict[int, str | None]:
    engine = make_engine(url)
    try:
        jobs = Table("jobs", MetaData(), autoload_with=engine)
        with engine.connect() as connection:
            return {row.id: row.backend for row in connection.execute(select(jobs.c.id, jobs.c.backend))}
    finally:
        engine.dispose()


def _trial_jobs(url: str) -> list[int]:
    engine = make_engine(url)
    try:
        trials = Table("trials", MetaData(), autoload_with=engine)
        with engine.connect() as connection:
            return list(connection.scalars(select(trials.c.job_id)))
    finally:
        engine.dispose()


def test_jobs_never_leased_of_sweeps_naming_no_backend_lose_it_and_get_it_back_on_downgrade(
    database_url: str,
) -> None:
    upgrade(database_url, "0009")
    _fill_at_0009(database_url)

    upgrade(database_url, "0010")
    assert current_revision(database_url) == "0010"
    assert _backends(database_url) == {1: None, 2: "torch", 3: "torch", 4: "torch", 5: None}
    assert _trial_jobs(database_url) == [2], "the trials still refer to their job"

    downgrade(database_url, "0009")
    assert _backends(database_url) == {1: "torch", 2: "torch", 3: "torch", 4: "torch", 5: "native"}
    upgrade(database_url)
    assert _backends(database_url) == {1: None, 2: "torch", 3: "torch", 4: "torch", 5: None}
    assert drift(database_url) == []
