"""``/compare``: two chips, or two software versions of one chip, side by side.

- **Chip against chip** (``a``, ``b``: chip names): the best configs of both chips joined on
  their key (kernel, kernel version, shape, dtype): the keys both tuned, each with a's and b's
  best time and ``ratio = b / a`` (above 1: b is slower).
- **Software against software on one chip** (``chip``; ``software_a``, ``software_b``: ids of
  the chip's software fingerprints): per key, the latest promotion under each software (the
  largest promotion id of the key and software), joined on the key; the same times and ratio.

With a chip chosen, the page also shows the chip's re-tuning (``table=retunes``: stale keys
queued after a software change, their job's state, and old against new time once done; see
:mod:`tiletune.service.dashboard.retune_table`).

Regressions first (ratio descending; ``sort`` may pick another column), filter ``kernel``,
paged in SQL. A summary, computed in SQL over every common key: how many, the median ratio,
how many regressed (ratio above :data:`REGRESSED`) and improved (below :data:`IMPROVED`). The
chart ``chart-compare`` plots the page's rows: a's time against b's, log-log, with the line
``y = x``. Without both sides chosen the page is the form alone (its table empty).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response
from sqlalchemy import ColumnElement, Select, Subquery, and_, case, func, select
from sqlalchemy.orm import Session, aliased

from tiletune.client.wire import MAX_DB_INT
from tiletune.kernels import all_declarations
from tiletune.service.dashboard.render import LOG_AXIS, figure, format_ms, render, shape_url
from tiletune.service.dashboard.retune_table import retune_table
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
from tiletune.service.errors import InvalidInputError
from tiletune.service.fleet import chip_by_name
from tiletune.service.models import BestConfigRow, ChipRow, PromotionRow, SoftwareRow
from tiletune.service.specs import lookup_kernel

router = APIRouter(include_in_schema=False)

#: A ratio above this is a regression (b slower than a by more than noise); below IMPROVED, a gain.
REGRESSED = 1.02
IMPROVED = 0.98
#: Point colours of the chart: regressed red, improved green, the rest grey.
POINT_COLOURS = {"regressed": "#c0392b", "improved": "#2e8b3a", "": "#6b7686"}
#: The most software fingerprints of a chip the form lists (newest first).
SOFTWARE_LISTED = 200

KEY = ("kernel", "kernel_version", "shape_key", "dtype")


@dataclass(frozen=True)
class Comparison:
    """Two sides' labels and their common keys: a subquery of KEY, ``a_ms`` and ``b_ms`` (> 0)."""

    a_label: str
    b_label: str
    pairs: Subquery


@dataclass(frozen=True)
class Summary:
    """The comparison over every common key (not only the page's)."""

    common: int
    median_ratio: float | None
    regressed: int
    improved: int


def _chip(session: Session, name: str, field: str) -> ChipRow:
    chip = chip_by_name(session, name)
    if chip is None:
        raise InvalidInputError(f"no chip {name!r} is registered", field=field)
    return chip


def chips_comparison(session: Session, a_name: str, b_name: str, kernel: str | None) -> Comparison:
    """The best configs of chips ``a_name`` and ``b_name`` joined on the key; 422 naming ``a`` or
    ``b`` for a chip nobody registered."""
    a_chip, b_chip = _chip(session, a_name, "a"), _chip(session, b_name, "b")
    a, b = aliased(BestConfigRow), aliased(BestConfigRow)
    query = (
        select(
            a.kernel,
            a.kernel_version,
            a.shape_key,
            a.dtype,
            a.median_ms.label("a_ms"),
            b.median_ms.label("b_ms"),
        )
        .join(
            b,
            and_(
                b.chip_id == b_chip.id,
                b.kernel == a.kernel,
                b.kernel_version == a.kernel_version,
                b.shape_key == a.shape_key,
                b.dtype == a.dtype,
            ),
        )
        .where(a.chip_id == a_chip.id, a.median_ms > 0)
    )
    if kernel:
        query = query.where(a.kernel == kernel)
    return Comparison(a_chip.name, b_chip.name, query.subquery())


def _software_label(session: Session, chip: ChipRow, software_id: int, field: str) -> str:
    software = session.get(SoftwareRow, software_id)
    if software is None or software.chip_id != chip.id:
        raise InvalidInputError(f"chip {chip.name!r} has no software {software_id}", field=field)
    return f"software {software_id}: {fingerprint_label(software.fingerprint)}"


def software_comparison(
    session: Session, chip: ChipRow, software_a: int, software_b: int, kernel: str | None
) -> Comparison:
    """Per key of ``chip``, its latest promotion under each software (the largest promotion id),
    joined on the key: one grouped pass over the chip's promotions, then two lookups by id.
    422 naming ``software_a`` or ``software_b`` for an id that is not one of the chip's."""
    labels = (
        _software_label(session, chip, software_a, "software_a"),
        _software_label(session, chip, software_b, "software_b"),
    )
    p = PromotionRow
    latest = (
        select(
            p.kernel,
            p.kernel_version,
            p.shape_key,
            p.dtype,
            func.max(case((p.software_id == software_a, p.id))).label("a_id"),
            func.max(case((p.software_id == software_b, p.id))).label("b_id"),
        )
        .where(p.chip_id == chip.id, p.software_id.in_((software_a, software_b)))
        .group_by(p.kernel, p.kernel_version, p.shape_key, p.dtype)
    )
    if kernel:
        latest = latest.where(p.kernel == kernel)
    keys = latest.subquery()
    a, b = aliased(PromotionRow), aliased(PromotionRow)
    query = (
        select(
            keys.c.kernel,
            keys.c.kernel_version,
            keys.c.shape_key,
            keys.c.dtype,
            a.median_ms.label("a_ms"),
            b.median_ms.label("b_ms"),
        )
        .join(a, a.id == keys.c.a_id)
        .join(b, b.id == keys.c.b_id)
        .where(a.median_ms > 0)
    )
    return Comparison(*labels, query.subquery())


def fingerprint_label(text: str) -> str:
    """A software fingerprint (canonical JSON) as ``torch 2.13.0, triton 3.1``."""
    try:
        parts = json.loads(text)
    except ValueError:
        return text
    if not isinstance(parts, dict):
        return text
    return ", ".join(f"{name} {version}" for name, version in sorted(parts.items())) or "unknown"


def _with_ratio(comparison: Comparison) -> tuple[Select[Any], ColumnElement[Any]]:
    """The common keys with a's and b's times, and the ratio b / a."""
    pairs = comparison.pairs
    ratio = (pairs.c.b_ms / pairs.c.a_ms).label("ratio")
    return select(*(pairs.c[name] for name in (*KEY, "a_ms", "b_ms")), ratio), ratio


def summary(session: Session, joined: Select[Any]) -> Summary:
    """Count, median ratio, regressions and improvements over every row of ``joined``, in SQL."""
    rows = joined.subquery()
    totals = session.execute(
        select(
            func.count(),
            func.sum(case((rows.c.ratio > REGRESSED, 1), else_=0)),
            func.sum(case((rows.c.ratio < IMPROVED, 1), else_=0)),
        )
    ).one()
    common = int(totals[0] or 0)
    if common == 0:
        return Summary(0, None, 0, 0)
    ranked = select(rows.c.ratio, func.row_number().over(order_by=rows.c.ratio).label("rank")).subquery()
    middle = and_(ranked.c.rank * 2 >= common, ranked.c.rank * 2 <= common + 2)
    median = session.scalar(select(func.avg(ranked.c.ratio)).where(middle))
    return Summary(common, median, int(totals[1] or 0), int(totals[2] or 0))


SORTS = ("ratio", "a_ms", "b_ms", "kernel")


def compare_table(
    session: Session, comparison: Comparison, sort: str | None, page: Paging
) -> tuple[Table, Summary]:
    """One page of the common keys (regressions first unless ``sort`` says otherwise) and the summary."""
    name, descending = sort_key(sort, SORTS, "-ratio")
    joined, ratio = _with_ratio(comparison)
    found = summary(session, joined)
    column = {"ratio": ratio, "a_ms": joined.selected_columns.a_ms, "b_ms": joined.selected_columns.b_ms}.get(
        name, joined.selected_columns.kernel
    )
    order: list[Any] = [column.desc() if descending else column.asc()]
    order += [joined.selected_columns[key] for key in KEY]
    rows = session.execute(joined.order_by(*order).limit(page.per_page).offset(page.offset)).all()
    columns = [
        Column("kernel", "Kernel", sortable=True),
        Column("kernel_version", "Version", "number"),
        Column("shape", "Shape"),
        Column("dtype", "Dtype"),
        Column("a_ms", f"a: {comparison.a_label}", "ms", sortable=True),
        Column("b_ms", f"b: {comparison.b_label}", "ms", sortable=True),
        Column("ratio", "b / a", "ratio", sortable=True),
    ]
    table_rows = [
        {
            "kernel": Link(kernel_, f"/kernels/{kernel_}"),
            "kernel_version": version,
            "shape": Link(shape_key, shape_url(kernel_, shape_key, dtype)),
            "dtype": dtype,
            "a_ms": a_ms,
            "b_ms": b_ms,
            "ratio": value,
            "_class": "regressed" if value > REGRESSED else "improved" if value < IMPROVED else "",
        }
        for kernel_, version, shape_key, dtype, a_ms, b_ms, value in rows
    ]
    table = Table(
        "compare",
        columns,
        table_rows,
        found.common,
        page,
        sort=name,
        descending=descending,
        empty="no common keys: no key is tuned on both sides",
    )
    return table, found


def compare_chart(table: Table, comparison: Comparison) -> dict[str, Any]:
    """The page's rows as points (x: a's time, y: b's time, log-log; coloured red where b regressed,
    green where it improved) and the line y = x."""
    xs = [row["a_ms"] for row in table.rows]
    ys = [row["b_ms"] for row in table.rows]
    keys = [f"{row['kernel'].text} {row['shape'].text} {row['dtype']}" for row in table.rows]
    text = [
        f"{key}<br>a {format_ms(x)} · b {format_ms(y)} · {y / x:.2f}×"
        for key, x, y in zip(keys, xs, ys, strict=True)
    ]
    low = min(xs + ys, default=0.01) / 1.25
    high = max(xs + ys, default=1.0) * 1.25
    data = [
        {
            "type": "scatter",
            "mode": "markers",
            "name": "keys",
            "x": xs,
            "y": ys,
            "text": text,
            "customdata": keys,
            "hovertemplate": "%{text}<extra></extra>",
            "marker": {"size": 8, "color": [POINT_COLOURS[row["_class"]] for row in table.rows]},
        },
        {
            "type": "scatter",
            "mode": "lines",
            "name": "y = x",
            "x": [low, high],
            "y": [low, high],
            "hoverinfo": "skip",
            "line": {"color": "#8a94a3", "dash": "dash", "width": 1},
        },
    ]
    layout = {
        "xaxis": {**LOG_AXIS, "title": {"text": f"a: {comparison.a_label} (ms)"}},
        "yaxis": {**LOG_AXIS, "title": {"text": f"b: {comparison.b_label} (ms)"}},
        "height": 420,
    }
    return figure(data, layout)


def chip_names(session: Session) -> list[str]:
    """Every registered chip's name (for the form)."""
    return list(session.scalars(select(ChipRow.name).order_by(ChipRow.name)))


def software_choices(session: Session, chip: ChipRow) -> list[dict[str, Any]]:
    """The chip's software fingerprints, newest first (for the form)."""
    rows = session.execute(
        select(SoftwareRow.id, SoftwareRow.fingerprint, SoftwareRow.first_seen_at)
        .where(SoftwareRow.chip_id == chip.id)
        .order_by(SoftwareRow.first_seen_at.desc(), SoftwareRow.id.desc())
        .limit(SOFTWARE_LISTED)
    ).all()
    return [
        {"id": id_, "label": fingerprint_label(text), "first_seen_at": aware(seen)}
        for id_, text, seen in rows
    ]


NameQuery = Annotated[str | None, Query(max_length=200)]
SoftwareQuery = Annotated[int | None, Query(ge=1, le=MAX_DB_INT)]


def _check_one_comparison(chips: bool, software: bool) -> None:
    """Refuse a request naming both two chips and one chip's two software versions."""
    if chips and software:
        raise InvalidInputError(
            "compare two chips (a, b) or two software versions of one chip (chip, software_a, "
            "software_b), not both",
            field="chip",
        )


@router.get("/compare")
def compare_page(
    request: Request,
    viewer: ViewerDep,
    *,
    db: DatabaseDep,
    page: Annotated[Paging, Depends(paging)],
    a: NameQuery = None,
    b: NameQuery = None,
    chip: NameQuery = None,
    software_a: SoftwareQuery = None,
    software_b: SoftwareQuery = None,
    kernel: Annotated[str | None, Query(max_length=64)] = None,
    sort: Annotated[str | None, Query(max_length=40)] = None,
    format: Format = "html",
    table: Annotated[str | None, Query(max_length=40)] = None,
) -> Response:
    """The compare page (see the module docstring); ``format=csv|json`` downloads its table."""
    a, b, chip, kernel = a or None, b or None, chip or None, kernel or None
    _check_one_comparison(bool(a or b), bool(chip or software_a or software_b))
    if kernel is not None:
        lookup_kernel(kernel)
    comparison: Comparison | None = None
    with db.read() as session:
        software: list[dict[str, Any]] = []
        retunes: Table | None = None
        if a and b:
            comparison = chips_comparison(session, a, b, kernel)
        elif chip:
            chip_row = _chip(session, chip, "chip")
            software = software_choices(session, chip_row)
            retunes = retune_table(session, chip_row.id, page, fingerprint_label)
            if software_a is not None and software_b is not None:
                comparison = software_comparison(session, chip_row, software_a, software_b, kernel)
        if comparison is not None:
            compared, found = compare_table(session, comparison, sort, page)
        else:
            compared, found = Table("compare", [], [], empty="choose both sides"), None
        if format != "html":
            return download(pick([compared, *([retunes] if retunes else [])], table), format)
        chips = chip_names(session)
    context = {
        "table": compared,
        "retunes": retunes,
        "summary": found,
        "comparison": comparison,
        "chart": compare_chart(compared, comparison) if comparison is not None else None,
        "chips": chips,
        "kernels": sorted(all_declarations()),
        "software": software,
        "a": a or "",
        "b": b or "",
        "chip": chip or "",
        "software_a": software_a,
        "software_b": software_b,
        "kernel": kernel or "",
        "regressed_above": REGRESSED,
        "improved_below": IMPROVED,
    }
    return render(request, viewer, "compare.html", context)
