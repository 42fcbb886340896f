"""``/kernels/{kernel}``: every tuned key of one kernel, its best time, speedup and throughput.

- **Best configs** of the kernel (every chip, dtype and kernel version the store holds), one
  row per key: best and default time, the speedup ``default_ms / median_ms`` (computed in SQL,
  so it sorts there), the achieved GFLOP/s and GB/s (from the kernel's ``flops`` and
  ``bytes_moved``, in Python for the page's rows only), the fraction of the chip's published
  peak that binds (:mod:`tiletune.kernels.peaks`; blank where the chip's peak is unknown), the
  software measured with, and a **stale** mark: a best measured with other software than the
  chip's newest (:func:`tiletune.service.fleet.newest_software_id`, here for every chip in one
  derived table), or with another version of the kernel than the one installed here.
  Filters in the URL: ``chip``, ``dtype``, ``q`` (a substring of the shape key), ``stale`` (only
  stale rows); sorted (``sort``) and paged (``page``, ``per_page``) in SQL, the total by COUNT.
- **Per chip**: keys tuned, how many are stale, and the median speedup (a window in SQL).
- A chart ``chart-speedups``: the speedup of the page's rows per shape, one trace per chip.

No query reads more than one page of best configs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from sqlalchemy import ColumnElement, Select, Subquery, and_, case, func, or_, select
from sqlalchemy.orm import InstrumentedAttribute, Session

from tiletune.kernels import KernelSpec, all_kernels
from tiletune.kernels.peaks import peak_fraction, peak_of
from tiletune.service.dashboard.overview import SPEEDUP, median_speedups
from tiletune.service.dashboard.render import figure, render, shape_url
from tiletune.service.dashboard.session import ViewerDep
from tiletune.service.dashboard.tables import (
    Column,
    Format,
    Link,
    Paging,
    Table,
    download,
    paging,
    pick,
    sort_key,
)
from tiletune.service.database import aware
from tiletune.service.errors import NotFoundError
from tiletune.service.models import BestConfigRow, ChipRow, SoftwareRow
from tiletune.service.specs import check_dtype

router = APIRouter(include_in_schema=False)

SelectT = TypeVar("SelectT", bound=Select[*tuple[Any, ...]])

#: The columns the best-configs table sorts by, and the SQL each sorts on.
SORTS: dict[str, ColumnElement[Any] | InstrumentedAttribute[Any]] = {
    "shape": BestConfigRow.shape_key,
    "dtype": BestConfigRow.dtype,
    "chip": ChipRow.name,
    "best_ms": BestConfigRow.median_ms,
    "default_ms": BestConfigRow.default_ms,
    "speedup": BestConfigRow.default_ms / BestConfigRow.median_ms,
    "promoted_at": BestConfigRow.promoted_at,
}
DEFAULT_SORT = "shape"


def kernel_spec(name: str) -> KernelSpec:
    """The registered kernel ``name`` (replay kernels too, when enabled); 404 naming ``kernel`` otherwise."""
    spec = all_kernels().get(name)
    if spec is None:
        raise NotFoundError(f"no kernel {name!r} is registered here", field="kernel")
    return spec


_NEWEST_FIRST = (SoftwareRow.first_seen_at.desc(), SoftwareRow.id.desc())


def newest_software() -> Subquery:
    """Per chip id: the id of the software its workers registered last (``fleet.newest_software_id``
    for every chip at once: a window over the small software table)."""
    ranked = select(
        SoftwareRow.chip_id,
        SoftwareRow.id.label("software_id"),
        func.row_number().over(partition_by=SoftwareRow.chip_id, order_by=_NEWEST_FIRST).label("rank"),
    ).subquery()
    return select(ranked.c.chip_id, ranked.c.software_id).where(ranked.c.rank == 1).subquery("newest")


def stale_condition(spec: KernelSpec, newest: Subquery) -> ColumnElement[bool]:
    """SQL true for a best measured with other software than its chip's newest, or another kernel version."""
    other_software = and_(
        newest.c.software_id.is_not(None), BestConfigRow.software_id.is_distinct_from(newest.c.software_id)
    )
    return or_(BestConfigRow.kernel_version != spec.version, other_software)


def stale_reason(
    spec: KernelSpec, kernel_version: int, software_id: int | None, newest_id: int | None
) -> str | None:
    """Why a best is stale (``software``, ``kernel v1 → v2``, or both), ``None`` when it is current."""
    reasons = []
    if newest_id is not None and software_id != newest_id:
        reasons.append("software")
    if kernel_version != spec.version:
        reasons.append(f"kernel v{kernel_version} → v{spec.version}")
    return "; ".join(reasons) or None


def short_fingerprint(text: str | None) -> str | None:
    """A software fingerprint (canonical JSON) in short: ``torch 2.5.1 · triton 3.1.0 · python 3.12.3``."""
    if not text:
        return None
    try:
        software = json.loads(text)
    except ValueError:
        return text[:60]
    if not isinstance(software, dict):
        return text[:60]
    order = ("torch", "triton", "torch_npu", "cann", "python")
    names = [name for name in order if software.get(name)] + sorted(
        name for name in software if name not in order and software[name]
    )
    return " · ".join(f"{name} {software[name]}" for name in names) or "—"


@dataclass(frozen=True)
class Throughput:
    """What one call achieved: GFLOP/s and GB/s (``None`` where the kernel counts none), and the
    fraction of the chip's published peak on the resource that binds (``None`` where unknown)."""

    gflops: float | None
    gbps: float | None
    peak_fraction: float | None


def throughput(
    spec: KernelSpec, shape: dict[str, int], dtype: str, chip: str, median_ms: float
) -> Throughput:
    """The achieved rates of a best config (a kernel whose counts fail on a shape counts none)."""
    if median_ms <= 0:
        return Throughput(None, None, None)
    seconds = median_ms / 1000.0
    try:
        flops = spec.flops(shape) / seconds
        moved = spec.bytes_moved(shape, dtype) / seconds
    except Exception:  # a plugin's count that fails on an old shape: no rate, never a 500
        return Throughput(None, None, None)
    flops_per_s = flops if flops > 0 else None
    bytes_per_s = moved if moved > 0 else None
    fraction = peak_fraction(peak_of(chip, dtype), flops_per_s, bytes_per_s)
    return Throughput(
        readable(flops_per_s / 1e9) if flops_per_s is not None else None,
        readable(bytes_per_s / 1e9) if bytes_per_s is not None else None,
        readable(fraction) if fraction is not None else None,
    )


def readable(value: float) -> float | int:
    """``value`` to three significant digits, as a whole number from 100 up (so tables show ``12,346``,
    never ``1.23e+04``); a measured time is not more precise than that."""
    if value >= 100:
        return round(value)
    return float(f"{value:.3g}")


@dataclass(frozen=True)
class Filters:
    """The kernel page's filters, as the URL gives them (empty means none)."""

    chip: str | None = None
    dtype: str | None = None
    q: str | None = None
    stale: bool = False


def filters(
    chip: str | None = None, dtype: str | None = None, q: str | None = None, stale: bool = False
) -> Filters:
    """The ``chip``, ``dtype``, ``q``, ``stale`` query parameters (a dependency); a bad dtype is 422."""
    return Filters(chip or None, check_dtype(dtype) if dtype else None, (q or "").strip() or None, stale)


def _filtered(query: SelectT, spec: KernelSpec, where: Filters, newest: Subquery) -> SelectT:
    query = query.where(BestConfigRow.kernel == spec.name)
    if where.chip is not None:
        query = query.where(ChipRow.name == where.chip)
    if where.dtype is not None:
        query = query.where(BestConfigRow.dtype == where.dtype)
    if where.q is not None:
        query = query.where(BestConfigRow.shape_key.contains(where.q, autoescape=True))
    if where.stale:
        query = query.where(stale_condition(spec, newest))
    return query


COLUMNS = (
    Column("shape", "Shape", sortable=True),
    Column("dtype", "Dtype", sortable=True),
    Column("chip", "Chip", sortable=True),
    Column("config", "Config", "config"),
    Column("best_ms", "Best", "ms", sortable=True),
    Column("default_ms", "Default", "ms", sortable=True),
    Column("speedup", "Speedup", "speedup", sortable=True),
    Column("gflops", "GFLOP/s", "number"),
    Column("gbps", "GB/s", "number"),
    Column("peak_fraction", "Of peak", "number"),
    Column("software", "Software"),
    Column("promoted_at", "Promoted", "when", sortable=True),
    Column("stale", "Stale"),
)


def best_table(session: Session, spec: KernelSpec, where: Filters, page: Paging, sort: str | None) -> Table:
    """One page of the kernel's best configs (see the module docstring)."""
    name, descending = sort_key(sort, list(SORTS), DEFAULT_SORT)
    newest = newest_software()
    joined = select(BestConfigRow.id).join(ChipRow, ChipRow.id == BestConfigRow.chip_id)
    joined = joined.outerjoin(newest, newest.c.chip_id == BestConfigRow.chip_id)
    counted = _filtered(joined, spec, where, newest).subquery()
    total = session.scalar(select(func.count()).select_from(counted))
    order = SORTS[name]
    rows = session.execute(
        _filtered(
            select(
                BestConfigRow.shape_key,
                BestConfigRow.shape,
                BestConfigRow.dtype,
                ChipRow.name.label("chip"),
                BestConfigRow.kernel_version,
                BestConfigRow.config,
                BestConfigRow.median_ms,
                BestConfigRow.default_ms,
                SPEEDUP,
                BestConfigRow.software_id,
                newest.c.software_id.label("newest_id"),
                SoftwareRow.fingerprint,
                BestConfigRow.promoted_at,
            )
            .join(ChipRow, ChipRow.id == BestConfigRow.chip_id)
            .outerjoin(newest, newest.c.chip_id == BestConfigRow.chip_id)
            .outerjoin(SoftwareRow, SoftwareRow.id == BestConfigRow.software_id),
            spec,
            where,
            newest,
        )
        .order_by(
            order.is_(None),  # unknown values last, whichever the direction and the database
            order.desc() if descending else order.asc(),
            BestConfigRow.shape_key,
            BestConfigRow.dtype,
            ChipRow.name,
            BestConfigRow.id,
        )
        .limit(page.per_page)
        .offset(page.offset)
    ).all()
    table_rows = []
    for row in rows:
        rates = throughput(spec, row.shape, row.dtype, row.chip, row.median_ms)
        reason = stale_reason(spec, row.kernel_version, row.software_id, row.newest_id)
        table_rows.append(
            {
                "shape": Link(row.shape_key, shape_url(spec.name, row.shape_key, row.dtype)),
                "dtype": row.dtype,
                "chip": row.chip,
                "config": row.config,
                "best_ms": row.median_ms,
                "default_ms": row.default_ms,
                "speedup": row.speedup,
                "gflops": rates.gflops,
                "gbps": rates.gbps,
                "peak_fraction": rates.peak_fraction,
                "software": short_fingerprint(row.fingerprint),
                "promoted_at": aware(row.promoted_at),
                "stale": reason,
                **({"_class": "stale"} if reason else {}),
            }
        )
    return Table(
        "best",
        COLUMNS,
        table_rows,
        total=total or 0,
        paging=page,
        sort=name,
        descending=descending,
        empty=f"no best config of {spec.name} matches the filters"
        if where != Filters()
        else f"{spec.name} is not tuned yet",
    )


def chips_table(session: Session, spec: KernelSpec) -> Table:
    """Per chip: keys tuned, how many are stale, and the median speedup over the default."""
    newest = newest_software()
    stale = func.sum(case((stale_condition(spec, newest), 1), else_=0))
    counts = (
        select(BestConfigRow.chip_id, func.count().label("tuned"), stale.label("stale"))
        .outerjoin(newest, newest.c.chip_id == BestConfigRow.chip_id)
        .where(BestConfigRow.kernel == spec.name)
        .group_by(BestConfigRow.chip_id)
        .subquery()
    )
    medians = median_speedups(spec.name)
    rows = session.execute(
        select(ChipRow.name, counts.c.tuned, counts.c.stale, medians.c.median)
        .join(counts, counts.c.chip_id == ChipRow.id)
        .outerjoin(medians, medians.c.chip_id == ChipRow.id)
        .order_by(ChipRow.name)
    ).all()
    columns = [
        Column("chip", "Chip"),
        Column("tuned", "Keys tuned", "number"),
        Column("stale", "Stale", "number"),
        Column("median_speedup", "Median speedup", "speedup"),
    ]
    return Table(
        "chips",
        columns,
        [
            {
                "chip": Link(chip, f"/kernels/{quote(spec.name, safe='')}?{urlencode({'chip': chip})}"),
                "tuned": tuned,
                "stale": int(stale or 0),
                "median_speedup": median,
            }
            for chip, tuned, stale, median in rows
        ],
        empty=f"{spec.name} is not tuned on any chip yet",
    )


def choices(session: Session, spec: KernelSpec) -> tuple[list[str], list[str]]:
    """The chips and dtypes the kernel has best configs on (the filters' dropdowns)."""
    of_kernel = BestConfigRow.kernel == spec.name
    chip_ids = select(BestConfigRow.chip_id).where(of_kernel).distinct()
    chips = session.scalars(select(ChipRow.name).where(ChipRow.id.in_(chip_ids)).order_by(ChipRow.name)).all()
    dtypes = session.scalars(
        select(BestConfigRow.dtype).where(of_kernel).distinct().order_by(BestConfigRow.dtype)
    ).all()
    return list(chips), list(dtypes)


#: The line of speedup 1 (as fast as the default) across the chart.
_PARITY = {
    "type": "line",
    "xref": "paper",
    "x0": 0,
    "x1": 1,
    "y0": 1,
    "y1": 1,
    "line": {"dash": "dot", "width": 1},
}


def speedups_figure(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The speedup of each row's shape, one trace per chip (x: the shape key)."""
    traces: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row["speedup"] is None:
            continue
        trace = traces.setdefault(
            row["chip"],
            {"type": "scatter", "mode": "markers", "name": row["chip"], "x": [], "y": [], "text": []},
        )
        trace["x"].append(row["shape"].text)
        trace["y"].append(row["speedup"])
        trace["text"].append(row["dtype"])
    layout = {
        "xaxis": {"title": {"text": "shape"}, "type": "category", "automargin": True},
        "yaxis": {"title": {"text": "speedup over the default (×)"}},
        "shapes": [_PARITY],
    }
    return figure(list(traces.values()), layout)


@router.get("/kernels/{kernel}")
def kernel_page(
    kernel: str,
    request: Request,
    *,
    viewer: ViewerDep,
    where: Annotated[Filters, Depends(filters)],
    page: Annotated[Paging, Depends(paging)],
    sort: str | None = None,
    format: Format = "html",
    table: str | None = None,
) -> Response:
    """The kernel page (see the module docstring); ``format=csv|json`` downloads a table."""
    spec = kernel_spec(kernel)
    services = request.app.state.services
    with services.db.read() as session:
        best = best_table(session, spec, where, page, sort)
        chips = chips_table(session, spec)
        chip_choices, dtype_choices = choices(session, spec)
    tables = [best, chips]
    if format != "html":
        return download(pick(tables, table), format)
    context = {
        "spec": spec,
        "best": best,
        "chips": chips,
        "where": where,
        "chip_choices": chip_choices,
        "dtype_choices": dtype_choices,
        "speedups": speedups_figure(best.rows),
    }
    return render(request, viewer, "kernel.html", context)
