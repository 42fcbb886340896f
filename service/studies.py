"""One Optuna ask-and-tell search per job, stored apart from our tables.

Each job owns the study ``job-<id>`` in Optuna's storage. A
:class:`~tiletune.tuner.search.Search` is built over it on first use (seeded
with the default config and the best configs of the nearest tuned shapes) and
kept in memory; after a restart it is rebuilt from the study, outstanding
trials included. Calls for one job are serialised by its lock. With
``shared`` storage (PostgreSQL: several server replicas may serve one job,
each call under the job's row lock) a kept search is rebuilt whenever the
study holds trials it has not seen.

Where Optuna's studies live (``optuna_storage_url``): for a SQLite database
``X.db`` Optuna's journal file ``X.optuna.log`` (``journal:`` URLs; an
ask-and-tell costs a few ms there against tens of ms in an SQLite RDB
storage); for PostgreSQL the same database, schema ``optuna`` (shared by
every replica); any other Optuna storage URL as given; an in-memory storage
when told ``memory``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tiletune.kernels import Config, DeviceLimits
from tiletune.service.database import is_sqlite, normalize_url
from tiletune.service.models import JobRow
from tiletune.service.specs import lookup_kernel
from tiletune.tuner.search import Search, SearchSpace

#: Optuna's journal file storage: ``journal:PATH``.
JOURNAL_PREFIX = "journal:"

#: The PostgreSQL schema of Optuna's tables.
OPTUNA_SCHEMA = "optuna"

#: Advisory lock key held while Optuna creates its tables (replicas starting at once).
OPTUNA_SETUP_LOCK = 0x7417E7C2

optuna.logging.set_verbosity(optuna.logging.WARNING)


def optuna_storage_url(db_url: str, optuna_url: str | None) -> str:
    """Where Optuna's studies live, from the settings (see the module docstring)."""
    if optuna_url:
        return optuna_url
    url = normalize_url(db_url)
    if is_sqlite(url):
        database = make_url(url).database
        if not database or database == ":memory:":
            return "memory"
        path = Path(database)
        return f"{JOURNAL_PREFIX}{path.with_name(path.stem + '.optuna.log')}"
    return url


def make_storage(url: str) -> optuna.storages.BaseStorage:
    """Optuna's storage at ``url``; PostgreSQL gets its own schema (created if missing)."""
    if url == "memory":
        return optuna.storages.InMemoryStorage()
    if url.startswith(JOURNAL_PREFIX):
        path = url[len(JOURNAL_PREFIX) :]
        lock = JournalFileOpenLock(path)
        return optuna.storages.JournalStorage(JournalFileBackend(path, lock_obj=lock))
    url = normalize_url(url)
    engine_kwargs: dict[str, Any] = {}
    if is_sqlite(url):
        engine_kwargs["connect_args"] = {"timeout": 30}
    elif make_url(url).get_backend_name() == "postgresql":
        engine_kwargs["connect_args"] = {"options": f"-csearch_path={OPTUNA_SCHEMA}"}
        return _postgres_storage(url, engine_kwargs)
    return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)


def _postgres_storage(url: str, engine_kwargs: dict[str, Any]) -> optuna.storages.BaseStorage:
    """Optuna's storage in its schema, set up under an advisory lock (Optuna's own DDL is not)."""
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": OPTUNA_SETUP_LOCK})
            try:
                connection.execute(text(f"CREATE SCHEMA IF NOT EXISTS {OPTUNA_SCHEMA}"))
                connection.commit()
                return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)
            finally:
                connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": OPTUNA_SETUP_LOCK})
                connection.commit()
    finally:
        engine.dispose()


class StudyHost:
    """The searches of running jobs, one per job, each behind its own lock."""

    def __init__(self, storage: optuna.storages.BaseStorage, shared: bool = False) -> None:
        self.storage = storage
        self.shared = shared
        self._searches: dict[int, Search] = {}
        self._locks: dict[int, threading.RLock] = {}
        self._guard = threading.Lock()

    def lock(self, job_id: int) -> threading.RLock:
        """The lock that serialises every use of job ``job_id``'s search."""
        with self._guard:
            return self._locks.setdefault(job_id, threading.RLock())

    def search(self, job: JobRow, limits: DeviceLimits, warm_start: Sequence[Config] = ()) -> Search:
        """The job's search, built (or resumed from its study) on first use; hold :meth:`lock`."""
        found = self._searches.get(job.id)
        if found is not None and not self._stale(found, job.id):
            return found
        spec = lookup_kernel(job.kernel)
        shape, dtype = dict(job.shape), job.dtype
        seeds = [spec.default_config(shape, dtype, limits), *warm_start]
        space = SearchSpace(
            knobs=spec.knob_values(shape),
            invalid_reason=lambda config: spec.invalid_reason(config, shape, dtype, limits),
            seeds=[seed for seed in seeds if _within(seed, spec.knob_values(shape))],
        )
        search = Search(
            space,
            strategy=job.strategy,
            seed=job.seed,
            max_trials=None if job.strategy == "grid" else job.trials,
            max_time_s=job.max_time_s,
            patience=job.patience,
            storage=self.storage,
            study_name=f"job-{job.id}",
        )
        self._searches[job.id] = search
        return search

    def cached(self, job_id: int) -> Search | None:
        """The job's search if it is in memory and up to date."""
        found = self._searches.get(job_id)
        return found if found is not None and not self._stale(found, job_id) else None

    def _stale(self, search: Search, job_id: int) -> bool:
        if not self.shared:
            return False
        study_id = self.storage.get_study_id_from_name(f"job-{job_id}")
        return bool(self.storage.get_n_trials(study_id) != search.trials_seen)

    def forget(self, job_id: int) -> None:
        """Drop a finished job's search from memory (its study stays in storage)."""
        self._searches.pop(job_id, None)


def _within(config: Config, knobs: dict[str, tuple[int, ...]]) -> bool:
    """True when every knob of ``config`` takes one of its values for this shape (warm starts may not)."""
    return config.keys() == knobs.keys() and all(config[name] in values for name, values in knobs.items())
