"""The searches of running jobs: in memory, rebuilt from the trials table, which is their record.

There is one record of a job's search: its ``search`` trials (rows of
:class:`~tiletune.service.models.TrialRow`). A :class:`~tiletune.tuner.search.search.Search` is
a cache of it, built on first use (seeded with the default config and the given warm
start when the job has no trials yet) and rebuilt from the rows whenever it may differ:

- after a restart (nothing is in memory);
- when ``jobs.search_seq`` moved past the number the search was built or last changed at:
  another replica wrote the job's trials (every change holds the job's row lock on
  PostgreSQL and moves the number, :meth:`SearchHost.changed`);
- after a transaction that changed it failed (:meth:`SearchHost.held` drops it: the rows
  rolled back, so must the search).

So nothing can diverge and there is no second store to tear or to fall behind. Rebuilding
reads a trial as the search knows it: ``measured`` → a measurement; ``failed`` and
``invalid`` → a failure with its reason; ``abandoned`` → asked again first; ``asked`` →
outstanding only while its lease is live (not ended, not past ``expires_at``): a trial
asked under a lease that is over (the server stopped between ending the lease and
abandoning its trials) is marked ``abandoned`` there and then. Calls for one job are
serialised by its lock (:meth:`SearchHost.held`); a replica's lock does not bind others,
the job's row lock does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

import optuna
from sqlalchemy import select
from sqlalchemy.orm import Session

from tiletune.client.wire import TrialState
from tiletune.kernels import Config, DeviceLimits
from tiletune.service.database import aware
from tiletune.service.models import JobRow, LeaseRow, TrialRow
from tiletune.service.specs import lookup_kernel
from tiletune.tuner.search.search import Search, SearchSpace
from tiletune.tuner.search.trials import PastTrial

optuna.logging.set_verbosity(optuna.logging.WARNING)

#: The reason a rebuild gives an asked trial whose lease is over.
LEASE_OVER = "asked under a lease that ended before its outcome was told"


@dataclass
class _Kept:
    search: Search
    seq: int


class SearchHost:
    """The in-memory searches of running jobs, one per job; see the module docstring."""

    def __init__(self) -> None:
        self._kept: dict[int, _Kept] = {}
        self._locks: dict[int, threading.RLock] = {}
        self._guard = threading.Lock()

    @contextmanager
    def held(self, job_id: int) -> Iterator[None]:
        """Hold job ``job_id``'s lock; a block that raises drops its search (rebuilt next time)."""
        with self._guard:
            lock = self._locks.setdefault(job_id, threading.RLock())
        with lock:
            try:
                yield
            except BaseException:
                self.forget(job_id)
                raise

    def cached(self, job: JobRow) -> Search | None:
        """The job's search if memory holds it at the job's current ``search_seq``."""
        kept = self._kept.get(job.id)
        return kept.search if kept is not None and kept.seq == job.search_seq else None

    def rebuild(
        self,
        session: Session,
        job: JobRow,
        limits: DeviceLimits,
        now: datetime,
        warm_start: Callable[[], Sequence[Config]],
    ) -> Search:
        """The job's search built from its trials (hold :meth:`held`; inside the write transaction).

        ``warm_start`` is called only for a job without trials yet: its configs are seeded after
        the default (a resumed search is seeded by its own past).
        """
        spec = lookup_kernel(job.kernel)
        shape, dtype = dict(job.shape), job.dtype
        knobs = spec.knob_values(shape, limits)
        past = self._past(session, job, now, knobs)
        seeds = [spec.default_config(shape, dtype, limits), *(() if past else warm_start())]
        space = SearchSpace(
            knobs=knobs,
            invalid_reason=lambda config: spec.invalid_reason(config, shape, dtype, limits),
            seeds=[seed for seed in seeds if _within(seed, knobs)],
        )
        search = Search(
            space,
            strategy=job.strategy,
            seed=job.seed,
            max_trials=None if job.strategy == "grid" else job.trials,
            max_time_s=job.max_time_s,
            patience=job.patience,
            past=past,
        )
        self._kept[job.id] = _Kept(search, job.search_seq)
        return search

    def changed(self, job: JobRow) -> None:
        """Record that the job's trials changed in this transaction (ask, tell, abandon)."""
        job.search_seq += 1
        kept = self._kept.get(job.id)
        if kept is not None:
            kept.seq = job.search_seq

    def forget(self, job_id: int) -> None:
        """Drop a job's search from memory (a finished job; a failed transaction)."""
        self._kept.pop(job_id, None)

    def _past(
        self, session: Session, job: JobRow, now: datetime, knobs: dict[str, tuple[int, ...]]
    ) -> list[PastTrial]:
        rows = session.execute(
            select(TrialRow, LeaseRow.ended_at, LeaseRow.expires_at)
            .join(LeaseRow, LeaseRow.id == TrialRow.lease_id)
            .where(TrialRow.job_id == job.id, TrialRow.phase == "search", TrialRow.number.is_not(None))
            .order_by(TrialRow.number)
        ).all()
        past: list[PastTrial] = []
        over = False
        for trial, ended_at, expires_at in rows:
            if trial.number is None or not _within(trial.config, knobs):
                continue
            if trial.state == TrialState.ASKED and (ended_at is not None or aware(expires_at) <= now):
                trial.state, trial.reason, trial.told_at = TrialState.ABANDONED, LEASE_OVER, now
                over = True
            past.append(_past_trial(trial))
        if over:
            self.changed(job)
        return past


def _past_trial(trial: TrialRow) -> PastTrial:
    number, config = trial.number or 0, dict(trial.config)
    if trial.state == TrialState.ASKED:
        return PastTrial(number, config, "outstanding")
    if trial.state == TrialState.MEASURED and trial.median_ms is not None:
        return PastTrial(number, config, "measured", time_ms=trial.median_ms)
    if trial.state in (TrialState.FAILED, TrialState.INVALID):
        return PastTrial(number, config, "failed", reason=trial.reason or trial.state)
    return PastTrial(number, config, "abandoned", reason=trial.reason or trial.state)


def _within(config: Config, knobs: dict[str, tuple[int, ...]]) -> bool:
    """True when every knob of ``config`` takes one of its values for this shape (warm starts may not)."""
    return config.keys() == knobs.keys() and all(config[name] in values for name, values in knobs.items())
