"""``/``, the overview: what is tuned where, what the fleet is doing, what changed last.

- **Coverage**: a kernel × chip matrix; each cell is the keys (shape, dtype) tuned over the
  keys requested (by sweeps or by clients' misses), coloured by the median speedup of its best
  configs over the kernel's default rule, and how many of its answers are torch's own op (the
  vendor config: no tiled config beat it). The median is taken in SQL (a window over the cell:
  :func:`tiletune.service.best_configs.median_speedups`).
- **Jobs** by state, each linking to the jobs list of that state.
- **Workers online** (seen within the lease time) with their chip and last heartbeat.
- **Newest promotions**, each linking to its shape page.

Every number is an aggregate the database computes; no table is read whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from sqlalchemy import case, func, select, union
from sqlalchemy.orm import Session

from tiletune.client.space import VENDOR_KNOB
from tiletune.client.wire import JOB_STATES
from tiletune.service.best_configs import median_speedups
from tiletune.service.dashboard.render import render, shape_url, speedup
from tiletune.service.dashboard.session import ViewerDep
from tiletune.service.dashboard.tables import Column, Format, Link, Table, download, pick
from tiletune.service.database import aware
from tiletune.service.dependencies import DatabaseDep, SettingsDep
from tiletune.service.models import BestConfigRow, ChipRow, JobRow, MissRow, PromotionRow, WorkerRow

router = APIRouter(include_in_schema=False)

#: How many promotions and workers the overview lists.
NEWEST = 10
WORKERS_SHOWN = 50
#: The chip column of jobs not bound to a chip yet and open to any.
ANY_CHIP = "*"


@dataclass(frozen=True)
class Cell:
    """One kernel × chip cell of the coverage matrix."""

    tuned: int
    requested: int
    median_speedup: float | None
    #: Of the tuned keys, those whose answer is torch's op (the vendor config).
    vendor: int = 0


def coverage(session: Session) -> tuple[list[str], list[str], dict[tuple[str, str], Cell]]:
    """Kernels, chips and the cells of the coverage matrix (see the module docstring)."""
    answered_by_vendor = BestConfigRow.config[VENDOR_KNOB].as_integer() == 1
    tuned_counts = (
        select(
            BestConfigRow.kernel,
            ChipRow.name.label("chip"),
            func.count().label("tuned"),
            func.sum(case((answered_by_vendor, 1), else_=0)).label("vendor"),
        )
        .join(ChipRow, ChipRow.id == BestConfigRow.chip_id)
        .group_by(BestConfigRow.kernel, ChipRow.name)
    )
    medians = median_speedups()
    median_rows = session.execute(
        select(medians.c.kernel, ChipRow.name, medians.c.median).join(
            ChipRow, ChipRow.id == medians.c.chip_id
        )
    ).all()
    job_chip = func.coalesce(ChipRow.name, JobRow.chip_target)
    requested_keys = union(
        select(JobRow.kernel, job_chip.label("chip"), JobRow.shape_key, JobRow.dtype).outerjoin(
            ChipRow, ChipRow.id == JobRow.chip_id
        ),
        select(MissRow.kernel, MissRow.chip_name.label("chip"), MissRow.shape_key, MissRow.dtype),
        select(
            BestConfigRow.kernel, ChipRow.name.label("chip"), BestConfigRow.shape_key, BestConfigRow.dtype
        ).join(ChipRow, ChipRow.id == BestConfigRow.chip_id),
    ).subquery()
    requested_counts = select(
        requested_keys.c.kernel, requested_keys.c.chip, func.count().label("requested")
    ).group_by(requested_keys.c.kernel, requested_keys.c.chip)
    tuned = {(kernel, chip): (count, vendor) for kernel, chip, count, vendor in session.execute(tuned_counts)}
    median = {(kernel, chip): value for kernel, chip, value in median_rows}
    cells = {}
    for kernel, chip, count in session.execute(requested_counts):
        tuned_keys, vendor_keys = tuned.get((kernel, chip), (0, 0))
        cells[kernel, chip] = Cell(tuned_keys, count, median.get((kernel, chip)), int(vendor_keys or 0))
    kernels = sorted({kernel for kernel, _ in cells})
    chips = sorted({chip for _, chip in cells}, key=lambda name: (name == ANY_CHIP, name))
    return kernels, chips, cells


def jobs_by_state(session: Session) -> dict[str, int]:
    """How many jobs are in each state (every state listed, zeros included)."""
    counts = dict(session.execute(select(JobRow.state, func.count()).group_by(JobRow.state)).tuples().all())
    return {state: counts.get(state, 0) for state in JOB_STATES}


def workers_table(session: Session, since_s: float, now: Any) -> Table:
    """The workers seen within ``since_s``, most recent first."""
    since = now - timedelta(seconds=since_s)
    rows = session.execute(
        select(WorkerRow.id, WorkerRow.name, ChipRow.name, WorkerRow.backends, WorkerRow.last_seen_at)
        .join(ChipRow, ChipRow.id == WorkerRow.chip_id)
        .where(WorkerRow.last_seen_at >= since)
        .order_by(WorkerRow.last_seen_at.desc(), WorkerRow.id.desc())
        .limit(WORKERS_SHOWN)
    ).all()
    columns = [
        Column("id", "Worker", "number"),
        Column("name", "Name"),
        Column("chip", "Chip"),
        Column("backends", "Backends"),
        Column("last_seen_at", "Last heartbeat", "when"),
    ]
    return Table(
        "workers",
        columns,
        [
            {"id": id_, "name": name, "chip": chip, "backends": ", ".join(kinds), "last_seen_at": aware(at)}
            for id_, name, chip, kinds, at in rows
        ],
        empty="no worker has been seen within the lease time",
    )


def promotions_table(session: Session) -> Table:
    """The newest promotions, newest first."""
    rows = session.execute(
        select(
            PromotionRow.kernel,
            PromotionRow.shape_key,
            PromotionRow.dtype,
            ChipRow.name,
            PromotionRow.median_ms,
            PromotionRow.default_ms,
            PromotionRow.previous_ms,
            PromotionRow.promoted_at,
        )
        .join(ChipRow, ChipRow.id == PromotionRow.chip_id)
        .order_by(PromotionRow.id.desc())
        .limit(NEWEST)
    ).all()
    columns = [
        Column("kernel", "Kernel"),
        Column("shape", "Shape"),
        Column("dtype", "Dtype"),
        Column("chip", "Chip"),
        Column("median_ms", "Best", "ms"),
        Column("previous_ms", "Before", "ms"),
        Column("speedup", "vs default", "speedup"),
        Column("promoted_at", "Promoted", "when"),
    ]
    table_rows = [
        {
            "kernel": Link(kernel, f"/kernels/{kernel}"),
            "shape": Link(shape_key, shape_url(kernel, shape_key, dtype)),
            "dtype": dtype,
            "chip": chip,
            "median_ms": best,
            "previous_ms": previous,
            "speedup": speedup(default, best),
            "promoted_at": aware(when),
        }
        for kernel, shape_key, dtype, chip, best, default, previous, when in rows
    ]
    return Table("promotions", columns, table_rows, empty="nothing has been promoted yet")


def coverage_table(kernels: list[str], chips: list[str], cells: dict[tuple[str, str], Cell]) -> Table:
    """The coverage matrix as a table (one row per kernel; a download holds every cell's numbers)."""
    columns = [Column("kernel", "Kernel")] + [Column(chip, chip) for chip in chips]
    rows = []
    for kernel in kernels:
        row: dict[str, Any] = {"kernel": Link(kernel, f"/kernels/{kernel}")}
        for chip in chips:
            cell = cells.get((kernel, chip))
            row[chip] = None if cell is None else f"{cell.tuned}/{cell.requested}"
            if cell is not None and cell.vendor:
                row[chip] += f" ({cell.vendor} torch's op)"
        rows.append(row)
    return Table("coverage", columns, rows, empty="no sweep has been submitted yet")


@router.get("/")
def overview(
    request: Request,
    *,
    viewer: ViewerDep,
    db: DatabaseDep,
    settings: SettingsDep,
    format: Format = "html",
    table: str | None = None,
) -> Response:
    """The overview page (see the module docstring); ``format=csv|json`` downloads a table."""
    with db.read() as session:
        kernels, chips, cells = coverage(session)
        states = jobs_by_state(session)
        workers = workers_table(session, settings.lease_s, db.clock())
        promotions = promotions_table(session)
    tables = [coverage_table(kernels, chips, cells), workers, promotions]
    if format != "html":
        return download(pick(tables, table), format)
    context = {
        "kernels": kernels,
        "chips": chips,
        "cells": cells,
        "states": states,
        "workers": workers,
        "promotions": promotions,
        "coverage": tables[0],
    }
    return render(request, viewer, "overview.html", context)
