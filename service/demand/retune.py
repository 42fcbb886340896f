"""Re-tuning after a software change: the most launched stale keys of a chip are queued as jobs.

Contract (one suite of tests runs it on SQLite and PostgreSQL):

- A chip's software *changes* when a worker registers a fingerprint new to it: that software
  becomes the chip's newest (:func:`tiletune.service.fleet.newest_software_id`), and its best
  configs measured with other software (or none recorded) turn stale
  (:func:`tiletune.service.best_configs.stale_condition`).
- Each change is planned once (a ``retune_plans`` row per chip and software, unique: of two
  replicas planning at once one plans, the other queues nothing): right after the registration
  that brought it (:meth:`Retuner.after_registration`), or by the reaper loop for a change whose
  planning did not run (:meth:`Retuner.plan_pending`). A registration of software already seen
  plans nothing. ``budget`` 0 (``TILETUNE_RETUNE_BUDGET``) turns re-tuning off: nothing is
  planned, and a change made while it was off is planned once it is turned on.
- A plan takes the chip's stale bests of the kernels' current versions that have no live job on
  the chip, launched most first (:func:`tiletune.service.demand.key_usage.launches`: the server's exact
  lookups, clients' per-key counts and misses; this replica's counts are flushed first; then the
  most recently promoted), and queues one job for each of the first ``budget``: a sweep named
  ``retune`` (no owner: the system's; that shape and dtype, ``chips=[chip]``, ``trials``, no
  backend), made by the sweeps' rules and limits (:mod:`tiletune.service.scheduling.jobs`; a key they
  refuse is passed over). Each queued key is kept in ``retunes`` with its old best (config,
  time, software) and its launches.
- The old best is served (marked stale) until the job ends: its validation re-measures it
  interleaved with the finalists (it is the key's current best) and promotes a config only when
  it beat the old best in that run (:func:`tiletune.tuner.search.finalists.judge`); when the old
  best wins, it stays, re-validated (:func:`revalidate`): measured with the chip's newest
  software, it is current (no longer stale, not queued again for that software).
- :func:`revalidate` applies to any job's validation run that keeps the key's best (a re-tuning
  job's or another's): when the validating worker runs the chip's newest software and the best
  was measured with other software, the best takes that software and the run's times
  (``median_ms``; ``default_ms`` when the default ran), and a promotions row records the
  re-measurement (the same config; the job and validation trial that measured it; the old time
  as ``previous_ms``), which is how every replica's index (:mod:`tiletune.service.index`) and
  the compare page's software comparison see it. The best keeps the job and trial that found it
  and its ``promoted_at``. A worker with older software re-validates nothing (it would make a
  current best stale).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from pydantic import ValidationError
from sqlalchemy import ColumnElement, Exists, and_, func, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from tiletune.client.wire import LIVE_JOB_STATES, JobState, SweepCreate
from tiletune.kernels import all_declarations
from tiletune.service.best_configs import newest_software
from tiletune.service.database import Database, configs_changed
from tiletune.service.demand.key_usage import KeyUsage, launches
from tiletune.service.errors import InvalidInputError
from tiletune.service.fleet import chip_by_name, newest_software_id
from tiletune.service.models import (
    BestConfigRow,
    ChipRow,
    JobRow,
    PromotionRow,
    RetunePlanRow,
    RetuneRow,
    TrialRow,
)
from tiletune.service.scheduling import jobs

log = logging.getLogger("tiletune.service")

#: The name of the sweeps re-tuning creates.
RETUNE_SWEEP = "retune"


@dataclass(frozen=True)
class RetunePolicy:
    """How many stale keys one software change of a chip queues (``budget``; 0: none), with
    ``trials`` per job, within the sweeps' limits (``max_shape_bytes``, ``max_jobs_per_sweep``)."""

    budget: int = 20
    trials: int = 40
    max_shape_bytes: int = jobs.DEFAULT_MAX_SHAPE_BYTES
    max_jobs_per_sweep: int = 10_000


@dataclass(frozen=True)
class RetunePlan:
    """What planning one change did: the chip, its new software, how many of its keys were stale
    (of the kernels' current versions), and the jobs queued (most launched key first)."""

    chip_id: int
    software_id: int
    stale: int
    job_ids: list[int]


class Retuner:
    """Plans re-tuning after software changes; see the module docstring for the contract."""

    def __init__(self, db: Database, usage: KeyUsage, policy: RetunePolicy) -> None:
        self.db = db
        self.usage = usage
        self.policy = policy

    def after_registration(self, chip_name: str) -> RetunePlan | None:
        """Plan the change a registration on ``chip_name`` brought, if it brought one not planned yet."""
        if self.policy.budget <= 0:
            return None
        with self.db.read() as session:
            chip = chip_by_name(session, chip_name)
            if chip is None or _planned(session, chip.id, newest_software_id(session, chip.id)):
                return None
            chip_id = chip.id
        return self._plan(chip_id)

    def plan_pending(self) -> list[RetunePlan]:
        """Plan every chip whose newest software has no plan yet (the reaper's catch-up)."""
        if self.policy.budget <= 0:
            return []
        newest = newest_software()
        with self.db.read() as session:
            pending = session.scalars(
                select(newest.c.chip_id)
                .outerjoin(
                    RetunePlanRow,
                    (RetunePlanRow.chip_id == newest.c.chip_id)
                    & (RetunePlanRow.software_id == newest.c.software_id),
                )
                .where(RetunePlanRow.id.is_(None))
                .order_by(newest.c.chip_id)
            ).all()
        plans = [self._plan(chip_id) for chip_id in pending]
        return [plan for plan in plans if plan is not None]

    def _plan(self, chip_id: int) -> RetunePlan | None:
        """Flush this replica's launches, then plan ``chip_id``'s newest software (one transaction);
        ``None`` when it was planned already (here or by another replica)."""
        try:
            self.usage.flush(self.db)
        except Exception:
            log.exception("storing the launches per key failed; re-tuning ranks keys without them")
        try:
            with self.db.write() as session:
                return plan_chip(session, chip_id, self.policy, self.db.clock())
        except IntegrityError:  # another replica planned this change first
            return None


def _planned(session: Session, chip_id: int, software_id: int | None) -> bool:
    """True when ``software_id`` (``None``: the chip has none) needs no plan on ``chip_id``."""
    if software_id is None:
        return True
    found = session.scalar(
        select(RetunePlanRow.id).where(
            RetunePlanRow.chip_id == chip_id, RetunePlanRow.software_id == software_id
        )
    )
    return found is not None


def plan_chip(session: Session, chip_id: int, policy: RetunePolicy, now: datetime) -> RetunePlan | None:
    """Plan ``chip_id``'s newest software in the caller's transaction (see the module docstring);
    ``None`` when it has none or it was planned. Raises :class:`IntegrityError` when another
    transaction plans it at the same time (the caller rolls back)."""
    software_id = newest_software_id(session, chip_id)
    if _planned(session, chip_id, software_id):
        return None
    assert software_id is not None
    plan = RetunePlanRow(chip_id=chip_id, software_id=software_id, stale=0, queued=0, planned_at=now)
    session.add(plan)
    session.flush()
    stale = _stale(chip_id, software_id)
    plan.stale = session.scalar(select(func.count()).where(*stale).select_from(BestConfigRow)) or 0
    chip = session.get_one(ChipRow, chip_id)
    ranked = session.execute(
        select(BestConfigRow, launches(chip_id))
        .where(*stale, ~_live_job(chip))
        .order_by(launches(chip_id).desc(), BestConfigRow.promoted_at.desc(), BestConfigRow.id)
        .limit(policy.budget)
    ).all()
    job_ids = []
    for best, launched in ranked:
        job_id = _queue(
            session, best, chip, software_id=software_id, launched=int(launched), policy=policy, now=now
        )
        if job_id is not None:
            job_ids.append(job_id)
    plan.queued = len(job_ids)
    return RetunePlan(chip_id, software_id, plan.stale, job_ids)


def _stale(chip_id: int, software_id: int) -> tuple[ColumnElement[bool], ...]:
    """The chip's bests measured with other software than ``software_id``, of current versions."""
    current = [(spec.name, spec.version) for spec in all_declarations().values()]
    return (
        BestConfigRow.chip_id == chip_id,
        BestConfigRow.software_id.is_distinct_from(software_id),
        or_(*(and_(BestConfigRow.kernel == name, BestConfigRow.kernel_version == v) for name, v in current)),
    )


def _live_job(chip: ChipRow) -> Exists:
    """SQL: the best row's key has a live job on ``chip`` (bound to it, or aimed at its name)."""
    return (
        select(JobRow.id)
        .where(
            JobRow.kernel == BestConfigRow.kernel,
            JobRow.kernel_version == BestConfigRow.kernel_version,
            JobRow.shape_key == BestConfigRow.shape_key,
            JobRow.dtype == BestConfigRow.dtype,
            JobRow.state.in_(LIVE_JOB_STATES),
            (JobRow.chip_id == chip.id) | (JobRow.chip_target == chip.name),
        )
        .exists()
    )


def _queue(
    session: Session,
    best: BestConfigRow,
    chip: ChipRow,
    *,
    software_id: int,
    launched: int,
    policy: RetunePolicy,
    now: datetime,
) -> int | None:
    """A re-tuning job for ``best``'s key, kept in ``retunes``; ``None`` when the sweeps' rules refuse it."""
    try:
        request = SweepCreate(
            name=RETUNE_SWEEP,
            kernel=best.kernel,
            shapes=[best.shape],
            dtypes=[best.dtype],
            chips=[chip.name],
            trials=policy.trials,
        )
        planned = jobs.plan_sweep(request, policy.max_jobs_per_sweep, policy.max_shape_bytes)
    except (InvalidInputError, ValidationError) as error:
        log.info("re-tuning passes over %s %s %s: %s", best.kernel, best.shape_key, best.dtype, error)
        return None
    job = jobs.create_sweep(session, request, planned, now).jobs[0]
    if job.state != JobState.QUEUED:
        return None
    session.add(
        RetuneRow(
            chip_id=chip.id,
            software_id=software_id,
            kernel=best.kernel,
            kernel_version=best.kernel_version,
            shape_key=best.shape_key,
            dtype=best.dtype,
            job_id=job.id,
            old_config=dict(best.config),
            old_ms=best.median_ms,
            old_software_id=best.software_id,
            launches=launched,
            queued_at=now,
        )
    )
    return job.id


def revalidate(
    session: Session,
    best: BestConfigRow,
    trial: TrialRow,
    *,
    software_id: int | None,
    default_ms: float | None,
    now: datetime,
) -> bool:
    """Record that a validation run kept ``best``, re-measured as ``trial`` (its validation row) by a
    worker with ``software_id``, ``default_ms`` the default's time in that run (None: not run); see
    the module docstring. True when the best was re-validated (it changed: the caller's transaction
    then changes best configs), False when nothing was to record."""
    if (
        software_id is None
        or trial.median_ms is None
        or best.software_id == software_id
        or software_id != newest_software_id(session, best.chip_id)
    ):
        return False
    previous_ms = best.median_ms
    best.software_id = software_id
    best.median_ms = trial.median_ms
    if default_ms is not None:
        best.default_ms = default_ms
    session.add(
        PromotionRow(
            kernel=best.kernel,
            kernel_version=best.kernel_version,
            shape_key=best.shape_key,
            dtype=best.dtype,
            chip_id=best.chip_id,
            config=dict(best.config),
            median_ms=best.median_ms,
            default_ms=best.default_ms,
            previous_ms=previous_ms,
            job_id=trial.job_id,
            trial_id=trial.id,
            software_id=software_id,
            promoted_at=now,
        )
    )
    session.flush()
    configs_changed(session)
    return True
