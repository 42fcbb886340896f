"""The compare page's re-tuning table (``table=retunes``): one chip's stale keys queued for
re-tuning after its software changed (:mod:`tiletune.service.demand.retune`), newest first.

Each row: the key, the launches that ranked it, the software change, its job and the job's
state, the old best's time when it was queued (``old_ms``), and once the job's validation ran:
the old best re-measured in that run (``old_run_ms``), the run's winner (``new_ms``), and the
outcome: ``replaced`` (the winner beat the old best in the run and was promoted), ``kept`` (the
old best won; it is re-validated with the new software and served as current), or the job's
state while it runs or if it failed.
One query for the page's rows, one for their validation trials.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tiletune.service.dashboard.render import shape_url
from tiletune.service.dashboard.tables import Column, Link, Paging, Table
from tiletune.service.models import BestConfigRow, JobRow, RetuneRow, SoftwareRow, TrialRow

COLUMNS = [
    Column("kernel", "Kernel"),
    Column("shape", "Shape"),
    Column("dtype", "Dtype"),
    Column("launches", "Launches", "number"),
    Column("software", "New software"),
    Column("job", "Job"),
    Column("outcome", "Outcome"),
    Column("old_ms", "Old best (when queued)", "ms"),
    Column("old_run_ms", "Old best (in the run)", "ms"),
    Column("new_ms", "Run's winner", "ms"),
]


def _validation_times(
    session: Session, job_ids: list[int]
) -> dict[int, list[tuple[dict[str, int], float | None]]]:
    """Each job's validation trials: ``(config, median_ms)`` by job id (one query)."""
    validated: dict[int, list[tuple[dict[str, int], float | None]]] = {}
    if job_ids:
        trials = session.execute(
            select(TrialRow.job_id, TrialRow.config, TrialRow.median_ms).where(
                TrialRow.job_id.in_(job_ids), TrialRow.phase == "validate"
            )
        )
        for job_id, config, median_ms in trials:
            validated.setdefault(job_id, []).append((config, median_ms))
    return validated


def retune_table(session: Session, chip_id: int, page: Paging, label: Any) -> Table:
    """One page of ``chip_id``'s re-tuned keys (see the module docstring); ``label`` names a
    software fingerprint's text."""
    total = session.scalar(select(func.count()).select_from(RetuneRow).where(RetuneRow.chip_id == chip_id))
    rows = session.execute(
        select(RetuneRow, JobRow.state, JobRow.best_ms, SoftwareRow.fingerprint, BestConfigRow.job_id)
        .join(JobRow, JobRow.id == RetuneRow.job_id)
        .join(SoftwareRow, SoftwareRow.id == RetuneRow.software_id)
        .outerjoin(
            BestConfigRow,
            (BestConfigRow.chip_id == RetuneRow.chip_id)
            & (BestConfigRow.kernel == RetuneRow.kernel)
            & (BestConfigRow.kernel_version == RetuneRow.kernel_version)
            & (BestConfigRow.shape_key == RetuneRow.shape_key)
            & (BestConfigRow.dtype == RetuneRow.dtype),
        )
        .where(RetuneRow.chip_id == chip_id)
        .order_by(RetuneRow.queued_at.desc(), RetuneRow.id.desc())
        .limit(page.per_page)
        .offset(page.offset)
    ).all()
    validated = _validation_times(session, [row.job_id for row, *_ in rows])
    table_rows = []
    for retune, state, best_ms, fingerprint, best_job in rows:
        old_run = next(
            (ms for config, ms in validated.get(retune.job_id, []) if config == retune.old_config), None
        )
        outcome = state
        if state == "done":
            outcome = "replaced" if best_job == retune.job_id else "kept"
        table_rows.append(
            {
                "kernel": Link(retune.kernel, f"/kernels/{retune.kernel}"),
                "shape": Link(retune.shape_key, shape_url(retune.kernel, retune.shape_key, retune.dtype)),
                "dtype": retune.dtype,
                "launches": retune.launches,
                "software": label(fingerprint),
                "job": Link(f"#{retune.job_id}", f"/jobs/{retune.job_id}"),
                "outcome": outcome,
                "old_ms": retune.old_ms,
                "old_run_ms": old_run,
                "new_ms": best_ms if state == "done" else None,
            }
        )
    return Table(
        "retunes",
        COLUMNS,
        table_rows,
        total or 0,
        page,
        empty="nothing queued for re-tuning on this chip (no software change made its bests stale)",
    )
