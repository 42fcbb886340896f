"""Rows as the API shows them: ORM rows (``*Row``) to wire documents (``*Public``).

Functions of rows and a session (for the rows they join); they read, never write.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tiletune.client.wire import (
    ANY_BACKEND,
    LIVE_JOB_STATES,
    BestConfigPublic,
    ConditionsPublic,
    HistoryPoint,
    JobConfirmation,
    JobProgress,
    JobPublic,
    SweepPublic,
    SweepState,
    SweepSummaryPublic,
    TrialPublic,
    WorkerPublic,
)
from tiletune.service.database import aware
from tiletune.service.models import (
    BestConfigRow,
    ChipRow,
    JobRow,
    LeaseRow,
    PromotionRow,
    SoftwareRow,
    SweepRow,
    TrialRow,
    WorkerRow,
)


def job_public(session: Session, job: JobRow) -> JobPublic:
    """A job with its progress."""
    chip = session.get(ChipRow, job.chip_id) if job.chip_id is not None else None
    speedup = job.default_ms / job.best_ms if job.default_ms and job.best_ms else None
    return JobPublic(
        id=job.id,
        sweep_id=job.sweep_id,
        kernel=job.kernel,
        kernel_version=job.kernel_version,
        shape=job.shape,
        shape_key=job.shape_key,
        dtype=job.dtype,
        chip=chip.name if chip is not None else job.chip_target,
        backend=job.backend if job.backend is not None else ANY_BACKEND,
        strategy=job.strategy,
        trials=job.trials,
        max_time_s=job.max_time_s,
        patience=job.patience,
        state=job.state,
        lease_failures=job.lease_failures,
        failure_reasons=list(job.failure_reasons),
        progress=JobProgress(
            completed=job.completed,
            invalid=job.invalid,
            failed=job.failed,
            best_ms=job.best_ms,
            best_config=job.best_config,
            default_ms=job.default_ms,
            speedup_vs_default=speedup,
        ),
        created_at=aware(job.created_at),
        updated_at=aware(job.updated_at),
        tuned_by=job.tuned_by_job_id,
        confirmation=JobConfirmation.model_validate(job.confirmation) if job.confirmation else None,
    )


def sweep_public(session: Session, sweep: SweepRow) -> SweepPublic:
    """A sweep with its jobs, their counts by state, and its own state."""
    jobs = session.scalars(select(JobRow).where(JobRow.sweep_id == sweep.id).order_by(JobRow.id)).all()
    counts: dict[str, int] = {}
    for job in jobs:
        counts[job.state] = counts.get(job.state, 0) + 1
    return SweepPublic(
        id=sweep.id,
        name=sweep.name,
        kernels=list(sweep.kernels),
        state=_sweep_state(counts),
        created_at=aware(sweep.created_at),
        counts=counts,
        jobs=[job_public(session, job) for job in jobs],
    )


def sweep_summaries(session: Session, sweeps: Sequence[SweepRow]) -> list[SweepSummaryPublic]:
    """Sweeps as a list shows them: their jobs counted by state in one query, never loaded.

    The query spans the sweeps' id range (one bound pair, not an ``IN`` of up to a page of
    ids): exactly the page's sweeps when they are consecutive, as a page of the list is.
    """
    counts: dict[int, dict[str, int]] = {sweep.id: {} for sweep in sweeps}
    if counts:
        query = (
            select(JobRow.sweep_id, JobRow.state, func.count())
            .where(JobRow.sweep_id.between(min(counts), max(counts)))
            .group_by(JobRow.sweep_id, JobRow.state)
        )
        for sweep_id, state, count in session.execute(query):
            if sweep_id in counts:
                counts[sweep_id][state] = count
    return [
        SweepSummaryPublic(
            id=sweep.id,
            name=sweep.name,
            kernels=list(sweep.kernels),
            state=_sweep_state(counts[sweep.id]),
            created_at=aware(sweep.created_at),
            counts=counts[sweep.id],
            job_count=sum(counts[sweep.id].values()),
        )
        for sweep in sweeps
    ]


def _sweep_state(counts: dict[str, int]) -> SweepState:
    """``running`` while any job is live, else ``finished``."""
    return SweepState.RUNNING if any(counts.get(state) for state in LIVE_JOB_STATES) else SweepState.FINISHED


def best_public(best: BestConfigRow, chip: str, software: dict[str, str | None]) -> BestConfigPublic:
    """A best-config row with its chip's name and software fingerprint."""
    return BestConfigPublic(
        kernel=best.kernel,
        kernel_version=best.kernel_version,
        shape=best.shape,
        shape_key=best.shape_key,
        dtype=best.dtype,
        chip=chip,
        config=best.config,
        median_ms=best.median_ms,
        default_config=best.default_config,
        default_ms=best.default_ms,
        speedup_vs_default=best.default_ms / best.median_ms if best.default_ms else None,
        job_id=best.job_id,
        trial_id=best.trial_id,
        software=software,
        promoted_at=aware(best.promoted_at),
    )


def software_of(session: Session, software_id: int | None) -> dict[str, str | None]:
    """The fingerprint of a software row (``{}`` for none)."""
    software = session.get(SoftwareRow, software_id) if software_id is not None else None
    fingerprint: dict[str, str | None] = json.loads(software.fingerprint) if software is not None else {}
    return fingerprint


def best_row_public(session: Session, best: BestConfigRow) -> BestConfigPublic:
    """:func:`best_public`, the chip and software read from the session."""
    chip = session.get(ChipRow, best.chip_id)
    return best_public(best, chip.name if chip is not None else "", software_of(session, best.software_id))


def history_point(session: Session, row: PromotionRow, chip: str) -> HistoryPoint:
    """One promotion of a key."""
    return HistoryPoint(
        promoted_at=aware(row.promoted_at),
        config=row.config,
        median_ms=row.median_ms,
        default_ms=row.default_ms,
        kernel_version=row.kernel_version,
        chip=chip,
        software=software_of(session, row.software_id),
        job_id=row.job_id,
    )


def trial_public(row: TrialRow, worker: str | None = None) -> TrialPublic:
    """One trial with its outcome, and the name of the worker that measured it."""
    return TrialPublic(
        id=row.id,
        number=row.number,
        phase=row.phase,
        config=row.config,
        state=row.state,
        median_ms=row.median_ms,
        p10_ms=row.p10_ms,
        p90_ms=row.p90_ms,
        samples=row.samples,
        reason=row.reason,
        asked_at=aware(row.asked_at),
        told_at=aware(row.told_at) if row.told_at is not None else None,
        conditions=ConditionsPublic.model_validate(row.conditions) if row.conditions else None,
        worker=worker,
    )


def lease_workers(session: Session, job_id: int) -> dict[int, str]:
    """The name of the worker of each lease of a job, by lease id."""
    rows = session.execute(
        select(LeaseRow.id, WorkerRow.name)
        .join(WorkerRow, WorkerRow.id == LeaseRow.worker_id)
        .where(LeaseRow.job_id == job_id)
    )
    return {row.id: row.name for row in rows}


def worker_public(worker: WorkerRow, chip: ChipRow, software: dict[str, str | None]) -> WorkerPublic:
    """A registered worker."""
    return WorkerPublic(
        id=worker.id,
        name=worker.name,
        chip=chip.name,
        backends=list(worker.backends),
        software=software,
        last_seen_at=aware(worker.last_seen_at),
    )
