"""``/jobs``: the jobs list, newest first, one page at a time.

Filtered by ``state``, ``kernel``, ``chip`` and ``sweep`` (in the URL; the overview's cards link
``/jobs?state=``), with LIMIT/OFFSET and COUNT in SQL; ``format=csv|json`` downloads the page.
An unknown state is a 422 naming ``state``.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tiletune.client.wire import JOB_STATES, MAX_DB_INT
from tiletune.service.dashboard.pages import job_chip
from tiletune.service.dashboard.render import render, shape_url, speedup
from tiletune.service.dashboard.session import ViewerDep
from tiletune.service.dashboard.tables import Column, Format, Link, Paging, Table, download, paging, pick
from tiletune.service.database import aware
from tiletune.service.dependencies import DatabaseDep
from tiletune.service.errors import InvalidInputError
from tiletune.service.models import ChipRow, JobRow

router = APIRouter(include_in_schema=False)

Filter = Annotated[str | None, Query(max_length=200)]

_LIST_COLUMNS = (
    JobRow.id,
    JobRow.kernel,
    JobRow.shape_key,
    JobRow.dtype,
    job_chip,
    JobRow.state,
    JobRow.completed,
    JobRow.invalid,
    JobRow.failed,
    JobRow.trials,
    JobRow.best_ms,
    JobRow.default_ms,
    JobRow.updated_at,
)


@dataclasses.dataclass(frozen=True)
class JobFilters:
    """The jobs list's filters (``None``: any)."""

    state: str | None = None
    kernel: str | None = None
    chip: str | None = None
    sweep: int | None = None


def jobs_table(session: Session, page: Paging, filters: JobFilters) -> Table:
    """One page of the jobs, newest first, with the filters applied in SQL; a bad ``state`` is a 422."""
    state, kernel, chip, sweep = filters.state, filters.kernel, filters.chip, filters.sweep
    if state is not None and state not in JOB_STATES:
        raise InvalidInputError(f"state must be one of {list(JOB_STATES)}, got {state!r}", field="state")
    conditions = []
    if state is not None:
        conditions.append(JobRow.state == state)
    if kernel is not None:
        conditions.append(JobRow.kernel == kernel)
    if chip is not None:
        conditions.append(job_chip == chip)
    if sweep is not None:
        conditions.append(JobRow.sweep_id == sweep)
    base = select(*_LIST_COLUMNS).outerjoin(ChipRow, ChipRow.id == JobRow.chip_id).where(*conditions)
    total = session.execute(select(func.count()).select_from(base.subquery())).scalar_one()
    rows = session.execute(base.order_by(JobRow.id.desc()).limit(page.per_page).offset(page.offset)).all()
    columns = [
        Column("id", "Job", "number"),
        Column("kernel", "Kernel"),
        Column("shape", "Shape"),
        Column("dtype", "Dtype"),
        Column("chip", "Chip"),
        Column("state", "State"),
        Column("trials", "Trials told / budget"),
        Column("best_ms", "Best", "ms"),
        Column("speedup", "vs default", "speedup"),
        Column("updated_at", "Updated", "when"),
    ]
    table_rows = [
        {
            "id": Link(str(id_), f"/jobs/{id_}"),
            "kernel": Link(kernel_, f"/kernels/{kernel_}"),
            "shape": Link(shape_key, shape_url(kernel_, shape_key, dtype)),
            "dtype": dtype,
            "chip": chip_,
            "state": state_,
            "trials": f"{completed + invalid + failed}/{budget}",
            "best_ms": best,
            "speedup": speedup(default, best),
            "updated_at": aware(updated),
        }
        for (
            id_,
            kernel_,
            shape_key,
            dtype,
            chip_,
            state_,
            completed,
            invalid,
            failed,
            budget,
            best,
            default,
            updated,
        ) in rows
    ]
    return Table("jobs", columns, table_rows, total=total, paging=page, empty="no job matches these filters")


def _blank(value: str | None) -> str | None:
    return value if value else None


@router.get("/jobs")
def jobs_list(
    request: Request,
    viewer: ViewerDep,
    *,
    db: DatabaseDep,
    page: Annotated[Paging, Depends(paging)],
    state: Filter = None,
    kernel: Filter = None,
    chip: Filter = None,
    sweep: Annotated[int | None, Query(ge=1, le=MAX_DB_INT)] = None,
    format: Format = "html",
    table: str | None = None,
) -> Response:
    """The jobs list (see the module docstring)."""
    filters = JobFilters(_blank(state), _blank(kernel), _blank(chip), sweep)
    with db.read() as session:
        jobs = jobs_table(session, page, filters)
    if format != "html":
        return download(pick([jobs], table), format)
    context = {"jobs": jobs, "states": JOB_STATES, **dataclasses.asdict(filters)}
    return render(request, viewer, "jobs.html", context)
