"""A job's pick is confirmed by a worker other than the one whose measurement leads.

- The *leader* of a job is the worker that measured its fastest search trial. When the search
  ends (:func:`await_confirmer`), the leader is excluded from the job's validation run. The
  lease that found the search done validates unless its worker leads; else the leader is
  answered ``done`` and the job waits in ``validating`` for another worker of its chip and its
  software (times of other software are not comparable, and a promotion is stamped with the
  validator's) to lease it (:func:`awaiting_confirmer`, among the queue's candidates).
- A chip with one such worker cannot confirm: the leader validates when no other worker of its
  software that can run the job is online (asked for a lease within the lease time, or holds a
  live one: :func:`may_validate`), and the answer is marked unconfirmed. A job nobody else leased
  for two lease times is offered to the leader again, which validates if the others went away and
  is answered ``done`` again otherwise.
- At completion (:func:`compare`), the winner's time in the validation run is compared with its
  search time as another worker measured it: beyond :data:`AGREEMENT_RATIO` either way, the
  workers disagree. The job stores who measured, who confirmed, both times and the verdict
  (``jobs.confirmation``, shown on its page and in ``JobPublic.confirmation``), and a winner the
  workers disagree on is not promoted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, and_, exists, or_, select
from sqlalchemy.orm import Session

from tiletune.client.wire import Config, JobState, TrialState
from tiletune.service.models import ChipRow, JobRow, LeaseRow, TrialRow, WorkerRow
from tiletune.service.scheduling.backends import offered_backends

#: How far apart two workers' medians of one config on one chip may be and still agree (either way).
AGREEMENT_RATIO = 2.0
#: Lease times a job waits for a confirmer before the leader may lease it again.
CONFIRM_WAIT_LEASES = 2


def leader_of(session: Session, job: JobRow) -> int | None:
    """The worker that measured ``job``'s fastest search trial (``None``: nothing measured)."""
    return session.scalar(
        select(LeaseRow.worker_id)
        .join(TrialRow, TrialRow.lease_id == LeaseRow.id)
        .where(TrialRow.job_id == job.id, TrialRow.phase == "search", TrialRow.state == TrialState.MEASURED)
        .order_by(TrialRow.median_ms, TrialRow.id)
        .limit(1)
    )


def await_confirmer(session: Session, job: JobRow) -> None:
    """The search is done: exclude its leader from the validation run; no lease validates yet."""
    job.validation_excluded_worker_id = leader_of(session, job)
    job.validator_lease_id = None


def may_validate(session: Session, job: JobRow, worker_id: int, now: datetime, online_s: float) -> bool:
    """Whether the worker ``worker_id`` may run ``job``'s validation: any but the leader, and the
    leader only while no other worker of its chip and software that can run the job is online."""
    if job.validation_excluded_worker_id is None or worker_id != job.validation_excluded_worker_id:
        return True
    return not _confirmer_online(session, job, worker_id, now, online_s)


def awaiting_confirmer(worker: WorkerRow, now: datetime, lease_s: float) -> ColumnElement[bool]:
    """Jobs of the worker's chip (the caller says which) waiting in ``validating``, with room for a
    lease, for a validator that ``worker`` may be: any of the leader's software but the leader,
    and the leader after the wait."""
    waited = now - timedelta(seconds=CONFIRM_WAIT_LEASES * lease_s)
    same_software = exists().where(
        WorkerRow.id == JobRow.validation_excluded_worker_id, WorkerRow.software_id == worker.software_id
    )
    return and_(
        JobRow.state == JobState.VALIDATING,
        JobRow.validator_lease_id.is_(None),
        JobRow.active_leases < JobRow.workers_per_job,
        or_(
            JobRow.validation_excluded_worker_id.is_(None),
            and_(JobRow.validation_excluded_worker_id != worker.id, same_software),
            JobRow.updated_at < waited,
        ),
    )


def _confirmer_online(session: Session, job: JobRow, leader_id: int, now: datetime, online_s: float) -> bool:
    assert job.chip_id is not None
    chip = session.get_one(ChipRow, job.chip_id)
    leader = session.get_one(WorkerRow, leader_id)
    busy = exists().where(
        LeaseRow.worker_id == WorkerRow.id, LeaseRow.ended_at.is_(None), LeaseRow.expires_at > now
    )
    others = session.scalars(
        select(WorkerRow).where(
            WorkerRow.chip_id == job.chip_id,
            WorkerRow.software_id == leader.software_id,
            WorkerRow.id != leader_id,
            or_(WorkerRow.last_seen_at >= now - timedelta(seconds=online_s), busy),
        )
    )
    return any(_can_run(worker, chip.kind, job) for worker in others)


def _can_run(worker: WorkerRow, chip_kind: str, job: JobRow) -> bool:
    offered: Sequence[str] = offered_backends(worker, chip_kind).get(job.kernel, ())
    versions = worker.kernel_versions
    version_fits = not versions or versions.get(job.kernel) == job.kernel_version
    return version_fits and (job.backend is None or job.backend in offered)


@dataclass(frozen=True)
class Confirmation:
    """Who measured a job's winner in its search and who confirmed it: the validating worker, unless
    it is the leader (``None``: its own pick, validated where no other worker was online)."""

    measured_by: list[str]
    confirmed_by: str | None
    search_ms: float | None
    validation_ms: float
    #: ``None`` where no other worker measured the winner in the search (nothing to compare).
    agree: bool | None

    def as_json(self) -> dict[str, object]:
        """As ``jobs.confirmation`` stores it."""
        return {
            "measured_by": self.measured_by,
            "confirmed_by": self.confirmed_by,
            "search_ms": self.search_ms,
            "validation_ms": self.validation_ms,
            "agree": self.agree,
            "agreement_ratio": AGREEMENT_RATIO,
        }


def compare(
    session: Session, job: JobRow, validator: LeaseRow, winner: Config, winner_ms: float
) -> Confirmation:
    """The winner's validation time (``winner_ms``, under ``validator``) against its search times
    measured by the other workers (their fastest median)."""
    searched = session.execute(
        select(WorkerRow.id, WorkerRow.name, TrialRow.config, TrialRow.median_ms)
        .join(LeaseRow, LeaseRow.id == TrialRow.lease_id)
        .join(WorkerRow, WorkerRow.id == LeaseRow.worker_id)
        .where(TrialRow.job_id == job.id, TrialRow.phase == "search", TrialRow.state == TrialState.MEASURED)
    ).all()
    of_winner = [(worker_id, name, ms) for worker_id, name, config, ms in searched if config == winner]
    validator_worker = session.get_one(WorkerRow, validator.worker_id)
    others = [ms for worker_id, _, ms in of_winner if worker_id != validator_worker.id and ms is not None]
    search_ms = min(others) if others else None
    agree = None
    if search_ms is not None and search_ms > 0:
        agree = 1 / AGREEMENT_RATIO <= winner_ms / search_ms <= AGREEMENT_RATIO
    measurers = sorted({name for _, name, _ in of_winner})
    led = job.validation_excluded_worker_id
    confirmed_by = validator_worker.name if led is None or validator_worker.id != led else None
    return Confirmation(measurers, confirmed_by, search_ms, winner_ms, agree)
