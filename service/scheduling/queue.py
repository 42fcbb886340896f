"""The job queue: leases in SQL, fenced by tokens, time from the database's injected clock.

A repository: every method takes the caller's session and never commits (see
:mod:`tiletune.service.database`). Contract (one suite of tests runs it on SQLite and
PostgreSQL, through the worker protocol):

- ``claim(session, worker, skipped)`` gives the worker the oldest job its chip and backends can
  run (a ``queued`` job for its chip or for any chip, a ``running`` job of its chip with room for
  another worker, or a ``validating`` job of its chip waiting for a worker other than its leader
  to confirm it: :mod:`tiletune.service.scheduling.confirmation`) and returns the lease, or ``None``;
  ``Missed.RACE`` when another claimer won the race or the job turned out tuned already. Claims
  are a compare-and-set on the job's ``active_leases`` (and its backend), so two workers never
  both take the last place on a job; PostgreSQL also selects with ``FOR UPDATE SKIP LOCKED`` so
  concurrent claimers do not wait on each other. A job of any chip binds to the chip that first
  leases it; a job that names no backend binds to the one that lease chooses
  (:mod:`tiletune.service.scheduling.backends`: the worker's preferred implementation of the kernel), stored
  on the job, so every later lease, trial and result of the job is of that backend, and only
  workers offering it lease it again.
- ``fence(session, token, holder)`` returns the lease and its job for a write, or raises
  :class:`~tiletune.service.errors.LeaseLostError`: the lease is unknown, ended, or past
  ``expires_at`` by the clock (even before it is reaped); a lease whose worker another token
  registered than ``holder`` is :class:`~tiletune.service.errors.ForbiddenError`.
- ``heartbeat(session, token)`` moves ``expires_at`` to now + ``lease_s``.
- ``end(session, lease, job, reason, failed)`` ends a lease; a job left with no active lease
  goes back to ``queued`` unless it is finished, and a failed or expired lease counts
  towards ``max_lease_failures``, after which the job is ``failed`` with its reasons.
- ``reap(session)`` ends every expired lease (as failed) and returns ``(job_id, lease_id)``
  of each, so the caller can abandon their outstanding trials.

Every change of a job's state is the lifecycle's (:mod:`tiletune.service.scheduling.lifecycle`).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import timedelta
from enum import Enum

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.orm import Session

from tiletune.client.wire import ANY_CHIP, JobState
from tiletune.service.configs import JobKey, tuned_on_software
from tiletune.service.database import Database, aware
from tiletune.service.errors import ForbiddenError, LeaseLostError
from tiletune.service.fleet import chip_limits
from tiletune.service.models import ChipRow, JobRow, LeaseRow, WorkerRow
from tiletune.service.scheduling import lifecycle
from tiletune.service.scheduling.backends import Offer, chosen_backend, offered_backends, runnable
from tiletune.service.scheduling.confirmation import awaiting_confirmer
from tiletune.service.scheduling.lifecycle import Event
from tiletune.service.specs import lookup_kernel

#: Claim attempts per lease request before giving up (others kept winning the race).
MAX_CLAIM_ATTEMPTS = 8


@dataclass(frozen=True)
class LeaseSettings:
    """Lease timing and the failure limit."""

    lease_s: float = 60.0
    heartbeat_s: float = 5.0
    max_lease_failures: int = 3


class Missed(Enum):
    """A claim that did not happen this time, but another attempt may succeed."""

    RACE = "another claimer took the place, or the job was tuned already"


class JobQueue:
    """Leases over the jobs; see the module docstring for the contract."""

    def __init__(self, db: Database, settings: LeaseSettings = LeaseSettings()) -> None:
        self.db = db
        self.settings = settings

    def claim(
        self, session: Session, worker: WorkerRow, skipped: set[int]
    ) -> tuple[LeaseRow, JobRow] | Missed | None:
        """One attempt at a lease for ``worker``; jobs in ``skipped`` (found tuned) are passed by."""
        chip = session.get_one(ChipRow, worker.chip_id)
        offer = offered_backends(worker, chip.kind)
        job = self._candidate(session, worker, chip, offer, skipped)
        if job is None:
            return None
        if self._already_tuned(session, job, worker):
            skipped.add(job.id)
            return Missed.RACE
        claimed = self._claim(session, job, worker, chosen_backend(job, offer))
        return claimed if claimed is not None else Missed.RACE

    def _candidate(
        self, session: Session, worker: WorkerRow, chip: ChipRow, offer: Offer, skipped: set[int]
    ) -> JobRow | None:
        chip_id = worker.chip_id
        open_job = or_(
            (JobRow.state == JobState.QUEUED) & (JobRow.chip_target.in_([chip.name, ANY_CHIP])),
            (JobRow.state == JobState.RUNNING)
            & (JobRow.chip_id == chip_id)
            & (JobRow.active_leases < JobRow.workers_per_job),
            (JobRow.chip_id == chip_id) & awaiting_confirmer(worker, self.db.clock(), self.settings.lease_s),
        )
        query = select(JobRow).where(
            open_job,
            or_(JobRow.chip_id.is_(None), JobRow.chip_id == chip_id),
            runnable(offer),
        )
        if worker.kernels:
            query = query.where(JobRow.kernel.in_(worker.kernels))
        if worker.kernel_versions:
            runs = [
                and_(JobRow.kernel == k, JobRow.kernel_version == v)
                for k, v in worker.kernel_versions.items()
            ]
            query = query.where(or_(*runs))
        if skipped:
            query = query.where(JobRow.id.not_in(skipped))
        query = query.order_by(JobRow.id).limit(1)
        if self.db.postgres:
            query = query.with_for_update(skip_locked=True)
        return session.scalar(query)

    def _already_tuned(self, session: Session, job: JobRow, worker: WorkerRow) -> bool:
        """Mark a job of any chip ``skipped`` when this chip already tuned its key on this software."""
        if job.force or job.chip_id is not None or job.state != JobState.QUEUED:
            return False
        key = JobKey(job.kernel, job.kernel_version, job.shape_key, job.dtype, worker.chip_id)
        if not tuned_on_software(session, key, worker.software_id):
            return False
        job.chip_id = worker.chip_id
        lifecycle.move(job, Event.ALREADY_TUNED, self.db.clock())
        return True

    def _claim(
        self, session: Session, job: JobRow, worker: WorkerRow, backend: str
    ) -> tuple[LeaseRow, JobRow] | None:
        now = self.db.clock()
        same_backend = JobRow.backend.is_(None) if job.backend is None else JobRow.backend == job.backend
        claimed = session.execute(
            update(JobRow)
            .where(
                JobRow.id == job.id,
                JobRow.active_leases == job.active_leases,
                JobRow.state == job.state,
                same_backend,
            )
            .values(
                active_leases=job.active_leases + 1,
                state=lifecycle.target(job.state, Event.CLAIMED),
                chip_id=worker.chip_id,
                backend=backend,
                updated_at=now,
            )
            .execution_options(synchronize_session=False)
        )
        if claimed.rowcount != 1:  # type: ignore[attr-defined]
            return None
        session.refresh(job)
        if job.default_config is None:
            spec = lookup_kernel(job.kernel)
            chip = session.get_one(ChipRow, worker.chip_id)
            job.default_config = spec.default_config(job.shape, job.dtype, chip_limits(chip))
        lease = LeaseRow(
            token=secrets.token_urlsafe(24),
            job_id=job.id,
            worker_id=worker.id,
            created_at=now,
            expires_at=now + timedelta(seconds=self.settings.lease_s),
        )
        session.add(lease)
        session.flush()
        return lease, job

    def fence(self, session: Session, token: str, holder: int | None) -> tuple[LeaseRow, JobRow]:
        """The live lease ``token`` of a worker of token ``holder``, and its job (row-locked on PostgreSQL).

        Raises :class:`LeaseLostError` when the lease is unknown, ended or expired,
        :class:`ForbiddenError` when it is another token's.
        """
        query = select(LeaseRow).where(LeaseRow.token == token)
        if self.db.postgres:  # lease row, then job row: the order reap takes them in too
            query = query.with_for_update()
        lease = session.scalar(query)
        if lease is None:
            raise LeaseLostError("no such lease; lease a job again", field="token")
        if lease.ended_at is not None:
            raise LeaseLostError(f"the lease ended: {lease.end_reason}", field="token")
        if aware(lease.expires_at) <= self.db.clock():
            raise LeaseLostError("the lease expired; its job went back to the queue", field="token")
        if self.worker_of(session, lease).token_id != holder:
            raise ForbiddenError("the lease is another token's worker's", field="token")
        job_query = select(JobRow).where(JobRow.id == lease.job_id)
        if self.db.postgres:
            job_query = job_query.with_for_update()
        job = session.scalar(job_query)
        assert job is not None
        return lease, job

    def heartbeat(self, session: Session, token: str, holder: int | None) -> tuple[LeaseRow, JobRow]:
        """Renew a live lease for another ``lease_s``."""
        lease, job = self.fence(session, token, holder)
        lease.expires_at = self.db.clock() + timedelta(seconds=self.settings.lease_s)
        session.flush()
        return lease, job

    def end(self, session: Session, lease: LeaseRow, job: JobRow, reason: str, failed: bool) -> None:
        """End ``lease``; requeue or fail its job as the contract says."""
        now = self.db.clock()
        lease.ended_at = now
        lease.end_reason = reason
        job.active_leases = max(0, job.active_leases - 1)
        job.updated_at = now
        if job.validator_lease_id == lease.id:
            job.validator_lease_id = None
            if lifecycle.allows(job.state, Event.VALIDATOR_LEFT):
                lifecycle.move(job, Event.VALIDATOR_LEFT, now)
        if failed:
            job.lease_failures += 1
            job.failure_reasons = [*job.failure_reasons, reason]
        if lifecycle.is_final(job.state):
            return
        if job.lease_failures >= self.settings.max_lease_failures:
            lifecycle.move(job, Event.TOO_MANY_FAILURES, now)
        elif job.active_leases == 0 and lifecycle.allows(job.state, Event.LEASES_ENDED):
            lifecycle.move(job, Event.LEASES_ENDED, now)

    def reap(self, session: Session) -> list[tuple[int, int]]:
        """End every expired lease as failed; ``(job_id, lease_id)`` of each, for abandoning its trials."""
        now = self.db.clock()
        query = select(LeaseRow).where(LeaseRow.ended_at.is_(None), LeaseRow.expires_at <= now)
        if self.db.postgres:  # another replica reaping at once takes the others
            query = query.with_for_update(skip_locked=True)
        reaped = []
        for lease in session.scalars(query).all():
            if aware(lease.expires_at) > now:
                continue
            job = session.get_one(JobRow, lease.job_id, with_for_update=self.db.postgres)
            self.end(session, lease, job, f"lease {lease.id} expired without a heartbeat", failed=True)
            reaped.append((job.id, lease.id))
        return reaped

    @staticmethod
    def leases_of(session: Session, job: JobRow) -> int:
        """How many leases ``job`` has had (the one just claimed included)."""
        return session.scalar(select(func.count()).where(LeaseRow.job_id == job.id)) or 0

    @staticmethod
    def worker_of(session: Session, lease: LeaseRow) -> WorkerRow:
        """The worker holding ``lease``."""
        return session.get_one(WorkerRow, lease.worker_id)
