"""``/kernels/{kernel}``: every tuned key of one kernel, its best time, speedup and throughput.

- **Best configs** of the kernel (every chip, dtype and kernel version the store holds), one
  row per key: best and default time, the speedup ``default_ms / median_ms`` (computed in SQL,
  so it sorts there), the achieved GFLOP/s and GB/s (from the kernel's ``flops`` and
  ``bytes_moved``, in Python for the page's rows only), the fraction of the chip's published
  peak that binds (:mod:`tiletune.kernels.peaks`; blank where the chip's peak is unknown), the
  software measured with, and a **stale** mark: a best measured with other software than the
  chip's newest (:func:`tiletune.service.fleet.newest_software_id`, here for every chip in one
  derived table), or with another version of the kernel than the one installed here (the
  queries are the read side's: :mod:`tiletune.service.best_configs`).
  Filters in the URL: ``chip``, ``dtype``, ``q`` (a substring of the shape key), ``stale`` (only
  stale rows); sorted (``sort``) and paged (``page``, ``per_page``) in SQL, the total by COUNT.
- **Per chip**: keys tuned, how many are stale, and the median speedup (a window in SQL).
- A chart ``chart-speedups``: the speedup of the page's rows per shape, one trace per chip.

No query reads more than one page of best configs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from sqlalchemy.orm import Session

from tiletune.kernels import KernelDeclaration
from tiletune.service.best_configs import (
    SORTS,
    BestFilters,
    chip_counts,
    kernel_bests,
    kernel_choices,
    stale_reason,
)
from tiletune.service.dashboard.pages import kernel_spec, short_fingerprint, throughput
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
from tiletune.service.dependencies import DatabaseDep
from tiletune.service.specs import check_dtype

router = APIRouter(include_in_schema=False)

DEFAULT_SORT = "shape"


def filters(
    chip: str | None = None, dtype: str | None = None, q: str | None = None, stale: bool = False
) -> BestFilters:
    """The ``chip``, ``dtype``, ``q``, ``stale`` query parameters (a dependency); a bad dtype is 422."""
    return BestFilters(chip or None, check_dtype(dtype) if dtype else None, (q or "").strip() or None, stale)


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


def best_table(
    session: Session, spec: KernelDeclaration, where: BestFilters, page: Paging, sort: str | None
) -> Table:
    """One page of the kernel's best configs (see the module docstring)."""
    name, descending = sort_key(sort, list(SORTS), DEFAULT_SORT)
    bests = kernel_bests(
        session,
        spec.name,
        spec.version,
        where,
        sort=name,
        descending=descending,
        limit=page.per_page,
        offset=page.offset,
    )
    table_rows = []
    for row in bests.rows:
        rates = throughput(spec, row.shape, row.dtype, row.chip, row.median_ms)
        reason = stale_reason(spec.version, row.kernel_version, row.software_id, row.newest_id)
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
        total=bests.total,
        paging=page,
        sort=name,
        descending=descending,
        empty=f"no best config of {spec.name} matches the filters"
        if where != BestFilters()
        else f"{spec.name} is not tuned yet",
    )


def chips_table(session: Session, spec: KernelDeclaration) -> Table:
    """Per chip: keys tuned, how many are stale, and the median speedup over the default."""
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
            for chip, tuned, stale, median in chip_counts(session, spec.name, spec.version)
        ],
        empty=f"{spec.name} is not tuned on any chip yet",
    )


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
    db: DatabaseDep,
    where: Annotated[BestFilters, Depends(filters)],
    page: Annotated[Paging, Depends(paging)],
    sort: str | None = None,
    format: Format = "html",
    table: str | None = None,
) -> Response:
    """The kernel page (see the module docstring); ``format=csv|json`` downloads a table."""
    spec = kernel_spec(kernel)
    with db.read() as session:
        best = best_table(session, spec, where, page, sort)
        chips = chips_table(session, spec)
        chip_choices, dtype_choices = kernel_choices(session, spec.name)
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
