"""Trials: the asked trial behind an outcome, an outcome recorded on it and its job, validation rows;
the trials a lease holds, and those left asked under leases that are over.

A repository: functions take the caller's session and never commit (see
:mod:`tiletune.service.database`). Trial states are the wire's
:class:`~tiletune.client.wire.TrialState`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from tiletune.client.wire import CompleteCreate, MeasurementWire, Task, TrialOutcome, TrialState
from tiletune.service.errors import ConflictError, InvalidInputError
from tiletune.service.models import JobRow, LeaseRow, TrialRow


def asked_trials(session: Session, job: JobRow, lease: LeaseRow, numbers: Sequence[int]) -> list[TrialRow]:
    """Trials ``numbers`` of ``job`` (read in one query), in that order.

    Refused, naming ``outcomes[i].trial_id``, when one does not exist or another lease holds it.
    """
    found = {
        trial.number: trial
        for trial in session.scalars(
            select(TrialRow).where(TrialRow.job_id == job.id, TrialRow.number.in_(set(numbers)))
        )
    }
    trials = []
    for index, number in enumerate(numbers):
        trial = found.get(number)
        if trial is None:
            raise InvalidInputError(
                f"job {job.id} has no trial {number}", field=f"outcomes[{index}].trial_id"
            )
        if trial.lease_id != lease.id and trial.state == TrialState.ASKED:
            raise ConflictError(
                f"trial {number} was asked under another lease", field=f"outcomes[{index}].trial_id"
            )
        trials.append(trial)
    return trials


def record_outcome(job: JobRow, trial: TrialRow, outcome: TrialOutcome, now: datetime) -> None:
    """Record ``outcome`` on ``trial`` and count it in ``job``'s progress (best so far, default's time)."""
    trial.told_at = now
    measurement = outcome.measurement
    if measurement is not None and outcome.error is None and outcome.invalid is None:
        trial.state = TrialState.MEASURED
        trial.median_ms = measurement.median_ms
        trial.p10_ms = measurement.p10_ms
        trial.p90_ms = measurement.p90_ms
        trial.min_ms = measurement.min_ms
        trial.samples = measurement.samples
        trial.pruned = measurement.pruned
        trial.conditions = stored_conditions(measurement)
        job.completed += 1
        if job.best_ms is None or measurement.median_ms < job.best_ms:
            job.best_ms = measurement.median_ms
            job.best_config = trial.config
        if trial.config == job.default_config:
            job.default_ms = measurement.median_ms
    elif outcome.invalid is not None:
        trial.state = TrialState.INVALID
        trial.reason = outcome.invalid
        job.invalid += 1
    else:
        trial.state = TrialState.FAILED
        trial.reason = outcome.error
        job.failed += 1


def stored_conditions(measurement: MeasurementWire | None) -> dict[str, Any] | None:
    """A measurement's conditions as the trials table stores them (JSON; None when not sent)."""
    if measurement is None or measurement.conditions is None:
        return None
    return measurement.conditions.model_dump(mode="json")


def validation_rows(
    session: Session, job: JobRow, lease: LeaseRow, request: CompleteCreate, now: datetime
) -> list[TrialRow]:
    """One ``validate`` trial per result of the final interleaved run (``validated`` or ``failed``)."""
    rows = []
    for result in request.results:
        m = result.measurement
        ran = m is not None and result.error is None
        row = TrialRow(
            job_id=job.id,
            number=None,
            lease_id=lease.id,
            phase="validate",
            config=result.config,
            state=TrialState.VALIDATED if ran else TrialState.FAILED,
            median_ms=m.median_ms if m and result.error is None else None,
            p10_ms=m.p10_ms if m else None,
            p90_ms=m.p90_ms if m else None,
            min_ms=m.min_ms if m else None,
            samples=m.samples if m else None,
            conditions=stored_conditions(m),
            reason=result.error,
            asked_at=now,
            told_at=now,
        )
        session.add(row)
        rows.append(row)
    session.flush()
    return rows


def asked_again(session: Session, job: JobRow, lease: LeaseRow, holding: set[int], n: int) -> list[Task]:
    """Up to ``n`` search trials ``lease`` holds that are not in ``holding``, oldest first, as tasks."""
    rows = session.scalars(
        select(TrialRow)
        .where(
            TrialRow.job_id == job.id,
            TrialRow.lease_id == lease.id,
            TrialRow.phase == "search",
            TrialRow.state == TrialState.ASKED,
        )
        .order_by(TrialRow.number)
    ).all()
    again = [row for row in rows if row.number is not None and row.number not in holding]
    return [Task(trial_id=row.number or 0, config=row.config) for row in again[:n]]


def asked_under_leases_over(session: Session, job: JobRow, now: datetime) -> bool:
    """True when a search trial of ``job`` is still ``asked`` under a lease that ended or expired."""
    query = (
        select(TrialRow.id)
        .join(LeaseRow, LeaseRow.id == TrialRow.lease_id)
        .where(
            TrialRow.job_id == job.id,
            TrialRow.phase == "search",
            TrialRow.state == TrialState.ASKED,
            or_(LeaseRow.ended_at.is_not(None), LeaseRow.expires_at <= now),
        )
        .limit(1)
    )
    return session.scalar(query) is not None


def check_outcome(outcome: TrialOutcome, index: int) -> None:
    """Refuse an outcome that is not exactly one of a measurement, ``invalid`` or ``error``."""
    given = [outcome.measurement is not None, outcome.invalid is not None, outcome.error is not None]
    if sum(given) != 1:
        raise InvalidInputError(
            "give exactly one of measurement, invalid or error", field=f"outcomes[{index}]"
        )


def outcome_reason(outcome: TrialOutcome) -> str | None:
    """Why an outcome has no time, as the search records it (``None`` for a measurement)."""
    if outcome.invalid is not None:
        return f"invalid on the worker: {outcome.invalid}"
    return outcome.error
