"""Demand: the keys clients missed most queue jobs that tune them, within the operator's budget.

Contract (one suite of tests runs it on SQLite and PostgreSQL):

- Demand (``threshold`` or ``jobs_per_chip_hour`` 0 turns it off) queues jobs in *passes*: one
  runs after each report of misses (over the report's chips) and one from the server's reaper
  loop (over every chip: the hour slides on, live jobs end; skipped while the replica writes a
  report on SQLite). A key is eligible when its count is at least ``threshold``, its chip is
  registered, it is of the kernel's current version, its bench holds at most ``max_shape_bytes``,
  it has no best config on that chip for that version, no job of the key is live (``queued``,
  ``running``, ``validating``) on that chip, and no job was ever kept on it (demand's, or a
  person's from :func:`tiletune.service.demand.selected_misses.queue_selected`).
- The budget: per chip, at most ``jobs_per_chip_hour`` keys queued by demand within the hour
  before the pass (``demand_queued_at``, the database's clock: a sliding hour). When the budget is
  short the eligible keys with the highest count go first (then the most recently reported, then
  the oldest).
- Each job comes from a sweep named ``demand`` (that shape and dtype, ``chips=[chip]``,
  ``trials``, no backend: its first lease runs the implementation the leasing worker prefers),
  made by the sweeps' rules and limits (:mod:`tiletune.service.scheduling.jobs`: ``max_shape_bytes``,
  ``max_jobs_per_sweep``); its id and time are kept on the key. At most one demand job per key:
  one that failed or was cancelled is for a person to look at and submit again.

Concurrency: a pass counts a chip's budget and queues under a lock that serialises passes over
that chip across replicas: the chip's row (``SELECT … FOR UPDATE``) on PostgreSQL, the writer
lock on SQLite; it takes its keys ``FOR UPDATE SKIP LOCKED`` (a key a report is counting this
instant waits for the next pass) and queues at most :data:`PASS_CHUNK_JOBS` jobs per
transaction. Replicas sharing a store together queue at most the budget.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta

from pydantic import ValidationError
from sqlalchemy import Select, func, or_, select
from sqlalchemy.orm import Session

from tiletune.client.wire import LIVE_JOB_STATES, JobPublic, JobState, SweepCreate
from tiletune.kernels import all_declarations
from tiletune.service.demand.miss_keys import MissKey, current_versions, key_of, same_key
from tiletune.service.demand.miss_writer import MissWriter
from tiletune.service.errors import InvalidInputError
from tiletune.service.models import BestConfigRow, ChipRow, JobRow, MissRow
from tiletune.service.scheduling import jobs

log = logging.getLogger("tiletune.service")

#: The name of the sweeps demand creates.
DEMAND_SWEEP = "demand"
#: The most demand jobs one transaction of a pass queues.
PASS_CHUNK_JOBS = 20
#: The window of the demand budget.
DEMAND_WINDOW = timedelta(hours=1)


@dataclass(frozen=True)
class MissPolicy:
    """When misses queue tuning: ``threshold`` reports of a key (0: never), with ``trials`` per job,
    at most ``jobs_per_chip_hour`` demand jobs per chip in any hour (0: none), within the sweeps'
    limits (``max_shape_bytes``, ``max_jobs_per_sweep``)."""

    threshold: int = 3
    trials: int = 40
    jobs_per_chip_hour: int = 20
    max_shape_bytes: int = jobs.DEFAULT_MAX_SHAPE_BYTES
    max_jobs_per_sweep: int = 10_000

    @property
    def demand_on(self) -> bool:
        """True when misses may queue jobs at all."""
        return self.threshold > 0 and self.jobs_per_chip_hour > 0


class Demand:
    """Demand passes over the chips' missed keys; see the module docstring for the contract."""

    def __init__(self, writer: MissWriter, policy: MissPolicy) -> None:
        self.db = writer.db
        self.writer = writer
        self.policy = policy

    def run_pass(self, chip_ids: Collection[int] | None) -> list[tuple[MissKey, int]]:
        """A demand pass (callers hold the writer's turn) over ``chip_ids`` (every registered chip
        when ``None``): per chip with budget left and an eligible key, queue the keys with the
        highest counts; ``(key, job id)`` of each job queued."""
        if not self.policy.demand_on:
            return []
        with self.db.read() as session:
            chips = list(chip_ids) if chip_ids is not None else list(session.scalars(select(ChipRow.id)))
            due = [
                chip_id
                for chip_id in chips
                if self._budget_left(session, chip_id, self.db.clock()) > 0
                and session.scalar(self._eligible(chip_id).with_only_columns(MissRow.id).limit(1)) is not None
            ]
        queued: list[tuple[MissKey, int]] = []
        for chip_id in due:
            queued.extend(self._pass_chip(chip_id))
        return queued

    def _pass_chip(self, chip_id: int) -> list[tuple[MissKey, int]]:
        """Queue ``chip_id``'s eligible keys, highest count first, until its budget or its keys run out."""
        queued: list[tuple[MissKey, int]] = []
        passed_over: list[int] = []  # keys this pass could not plan: not taken again
        chunk = min(PASS_CHUNK_JOBS, self.policy.max_jobs_per_sweep)
        while True:
            with self.writer.write() as session:
                now = self.db.clock()
                # the chip's lock (PostgreSQL; SQLite's writer lock is held already): passes of
                # other replicas over this chip wait here, then count what this one queued
                session.execute(select(ChipRow.id).where(ChipRow.id == chip_id).with_for_update())
                left = min(chunk, self._budget_left(session, chip_id, now))
                if left <= 0:
                    return queued
                eligible = self._eligible(chip_id)
                if passed_over:
                    eligible = eligible.where(MissRow.id.not_in(passed_over))
                rows = session.scalars(
                    eligible.limit(left).with_for_update(skip_locked=True, of=MissRow)
                ).all()
                if not rows:
                    return queued
                for row in rows:
                    job = self._queue(session, row, now)
                    if job is None:
                        passed_over.append(row.id)
                    elif job.state == JobState.QUEUED:
                        queued.append((key_of(row), job.id))

    def _budget_left(self, session: Session, chip_id: int, now: datetime) -> int:
        """Demand jobs ``chip_id`` may still have queued in the hour before ``now``."""
        used = session.scalar(
            select(func.count())
            .select_from(MissRow)
            .where(MissRow.chip_id == chip_id, MissRow.demand_queued_at > now - DEMAND_WINDOW)
        )
        return self.policy.jobs_per_chip_hour - (used or 0)

    def _eligible(self, chip_id: int) -> Select[MissRow]:
        """``chip_id``'s keys that demand may queue (see the module docstring), highest count first."""
        current = current_versions(all_declarations().values())
        tuned = (
            select(BestConfigRow.id)
            .where(*same_key(BestConfigRow), BestConfigRow.chip_id == MissRow.chip_id)
            .exists()
        )
        live = (
            select(JobRow.id)
            .where(
                *same_key(JobRow),
                JobRow.state.in_(LIVE_JOB_STATES),
                or_(JobRow.chip_id == MissRow.chip_id, JobRow.chip_target == MissRow.chip_name),
            )
            .exists()
        )
        return (
            select(MissRow)
            .where(
                MissRow.chip_id == chip_id,
                MissRow.count >= self.policy.threshold,
                MissRow.job_id.is_(None),
                MissRow.demand_queued_at.is_(None),
                current,
                or_(MissRow.bench_bytes.is_(None), MissRow.bench_bytes <= self.policy.max_shape_bytes),
                ~tuned,
                ~live,
            )
            .order_by(MissRow.count.desc(), MissRow.last_seen_at.desc(), MissRow.id)
        )

    def _queue(self, session: Session, row: MissRow, now: datetime) -> JobPublic | None:
        """A demand job for ``row``'s key (its id and time kept on the key), or ``None`` when the
        sweeps' rules refuse it (a key counted before its bench size was kept, over the limit)."""
        try:
            request = SweepCreate(
                name=DEMAND_SWEEP,
                kernel=row.kernel,
                shapes=[row.shape],
                dtypes=[row.dtype],
                chips=[row.chip_name],
                trials=self.policy.trials,
            )
            planned = jobs.plan_sweep(request, self.policy.max_jobs_per_sweep, self.policy.max_shape_bytes)
        except (InvalidInputError, ValidationError) as error:
            log.info("demand passes over %s %s %s: %s", row.kernel, row.shape_key, row.dtype, error)
            return None
        job = jobs.create_sweep(session, request, planned, now).jobs[0]
        row.job_id = job.id
        row.demand_queued_at = now
        return job
