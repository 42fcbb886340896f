"""The end of a job: its validation run judged, confirmed, and its winner promoted or not.

:func:`settle` takes the rows of a validation run
(:func:`~tiletune.service.scheduling.trials.validation_rows`) and, in the caller's transaction:

- judges them (:func:`~tiletune.tuner.search.finalists.judge`: the winner, and whether it beats
  the key's best in that run), recording the winner and the default's time on the job;
- compares the winner's time with the other workers' search times
  (:func:`~tiletune.service.scheduling.confirmation.compare`), stored as ``jobs.confirmation``;
- promotes the winner when it beats the key's best and the workers do not disagree on it; a run
  the key's best won re-validates that best with this software
  (:func:`~tiletune.service.demand.retune.revalidate`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy.orm import Session

from tiletune.service import configs, failpoints
from tiletune.service.configs import JobKey, Winner
from tiletune.service.demand.retune import revalidate
from tiletune.service.models import JobRow, LeaseRow, TrialRow
from tiletune.service.scheduling import confirmation
from tiletune.service.specs import vendor_finalist
from tiletune.tuner.search.finalists import Timing, judge


def settle(
    session: Session,
    job: JobRow,
    lease: LeaseRow,
    rows: Sequence[TrialRow],
    *,
    software_id: int,
    now: datetime,
) -> bool:
    """Judge, confirm and promote (see the module docstring); False when no config ran correctly."""
    measured = [(row, row.median_ms) for row in rows if row.median_ms is not None]
    incumbent = configs.best_row(session, JobKey.of(job))
    verdict = judge(
        [Timing(row.config, ms, row.p90_ms, row.p10_ms, row.samples) for row, ms in measured],
        job.default_config,
        incumbent.config if incumbent is not None else None,
        vendor_finalist(job.kernel),
    )
    if verdict is None:
        return False
    winner_row = next(row for row, _ in measured if row.config == verdict.winner)
    job.best_ms, job.best_config = verdict.winner_ms, verdict.winner
    job.default_ms = verdict.default_ms if verdict.default_ms is not None else job.default_ms
    confirmed = confirmation.compare(session, job, lease, verdict.winner, verdict.winner_ms)
    job.confirmation = confirmed.as_json()
    if verdict.promote and confirmed.agree is not False:
        winner = Winner(
            shape=job.shape,
            config=verdict.winner,
            median_ms=verdict.winner_ms,
            default_config=job.default_config,
            default_ms=verdict.default_ms,
            job_id=job.id,
            trial_id=winner_row.id,
            software_id=software_id,
        )
        configs.promote(session, JobKey.of(job), winner, now)
        session.flush()
        failpoints.reach("complete.promoted")
    elif not verdict.promote and incumbent is not None:  # the key's best won, with this software
        revalidate(
            session, incumbent, winner_row, software_id=software_id, default_ms=verdict.default_ms, now=now
        )
    return True
