"""``/kernels/{kernel}/shapes/{shape_key}``: one key's best config, its history, its neighbours.

The path names the shape as text (``rows=64,cols=256``; parsed and checked by the kernel's
spec, then read under its canonical key), ``?dtype=`` the dtype (``float32`` by default) and
``?chip=`` optionally one chip.

- **Best per chip**, with provenance: the job and trial it came from, the software it was
  measured with, when it was promoted, the default config and its time, the speedup, and the
  stale mark of the kernel page (:mod:`.kernel_page`; both read through
  :mod:`tiletune.service.best_configs`).
- **History** ``chart-history``: every promotion of the key (``promotions`` by kernel, shape key,
  dtype: an index) as a point over its time, one trace per (chip, kernel version, software), and
  per chip a dashed trace of the default's time; and the promotions as a table, newest first.
- **Nearest tuned neighbours** per chip: the tuned shapes of the same kernel version and dtype
  nearest this one, found in the replica's in-memory index of best configs
  (``services.reads.index``) by the distance lookups use (:func:`tiletune.client.nearest.nearest`:
  categorical dims equal, ``|log2|`` differences summed).

Every table downloads as CSV or JSON (``format``, ``table``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tiletune.client.nearest import nearest
from tiletune.client.wire import DTYPES
from tiletune.kernels import KernelDeclaration, Shape
from tiletune.service.best_configs import key_bests, stale_reason
from tiletune.service.dashboard.pages import kernel_spec, readable, short_fingerprint, throughput
from tiletune.service.dashboard.render import LOG_AXIS, figure, render, shape_url, speedup
from tiletune.service.dashboard.session import ViewerDep
from tiletune.service.dashboard.tables import Column, Format, Link, Table, download, pick
from tiletune.service.database import Database, aware
from tiletune.service.dependencies import DatabaseDep, ReadsDep
from tiletune.service.entries import entry_best, entry_shape
from tiletune.service.errors import InvalidInputError
from tiletune.service.index import Snapshot
from tiletune.service.models import ChipRow, PromotionRow, SoftwareRow
from tiletune.service.specs import parse_key

router = APIRouter(include_in_schema=False)

#: Promotions of one key the page reads at most (newest first); a key is promoted a few times a version.
HISTORY_LIMIT = 2_000
#: Nearest tuned shapes listed per chip.
NEIGHBOURS = 5
#: A history whose times span more than this ratio is drawn on a log axis.
LOG_SPREAD = 20.0


@dataclass(frozen=True)
class Key:
    """What a shape page shows: the spec, the parsed shape, its canonical text, the dtype, a chip or all."""

    spec: KernelDeclaration
    shape: Shape
    shape_key: str
    dtype: str
    chip: str | None


def parse_page_key(kernel: str, shape_key: str, dtype: str, chip: str | None) -> Key:
    """The page's key: an unknown kernel is 404 (``kernel``), a bad shape or dtype 422 naming it."""
    kernel_spec(kernel)
    try:
        spec, shape = parse_key(kernel, shape_key, dtype)
    except InvalidInputError as error:
        if error.field == "dtype":
            raise
        raise InvalidInputError(f"not a shape of {kernel}: {error.message}", field="shape") from error
    return Key(spec, shape, spec.canonical_shape(shape), dtype, chip or None)


def job_link(job_id: int | None) -> Link | None:
    """A link to a job's page."""
    return Link(f"#{job_id}", f"/jobs/{job_id}") if job_id is not None else None


def best_table(session: Session, key: Key) -> Table:
    """The key's best config on each chip (every kernel version the store holds), with provenance."""
    columns = [
        Column("chip", "Chip"),
        Column("kernel_version", "Version", "number"),
        Column("config", "Config", "config"),
        Column("best_ms", "Best", "ms"),
        Column("default_config", "Default config", "config"),
        Column("default_ms", "Default", "ms"),
        Column("speedup", "Speedup", "speedup"),
        Column("gflops", "GFLOP/s", "number"),
        Column("gbps", "GB/s", "number"),
        Column("peak_fraction", "Of peak", "number"),
        Column("job", "Job"),
        Column("trial_id", "Trial", "number"),
        Column("software", "Software"),
        Column("promoted_at", "Promoted", "when"),
        Column("stale", "Stale"),
    ]
    rows = []
    for row in key_bests(session, key.spec.name, key.shape_key, key.dtype, key.chip):
        rates = throughput(key.spec, key.shape, key.dtype, row.chip, row.median_ms)
        reason = stale_reason(key.spec.version, row.kernel_version, row.software_id, row.newest_id)
        rows.append(
            {
                "chip": row.chip,
                "kernel_version": row.kernel_version,
                "config": row.config,
                "best_ms": row.median_ms,
                "default_config": row.default_config,
                "default_ms": row.default_ms,
                "speedup": speedup(row.default_ms, row.median_ms),
                "gflops": rates.gflops,
                "gbps": rates.gbps,
                "peak_fraction": rates.peak_fraction,
                "job": job_link(row.job_id),
                "trial_id": row.trial_id,
                "software": short_fingerprint(row.fingerprint),
                "promoted_at": aware(row.promoted_at),
                "stale": reason,
                **({"_class": "stale"} if reason else {}),
            }
        )
    return Table("best", columns, rows, empty="this key is not tuned on any chip yet")


def history_rows(session: Session, key: Key) -> tuple[list[Any], int]:
    """The key's newest :data:`HISTORY_LIMIT` promotions, oldest first, and how many there are in all."""
    where = (
        PromotionRow.kernel == key.spec.name,
        PromotionRow.shape_key == key.shape_key,
        PromotionRow.dtype == key.dtype,
    )
    chip_filter = (ChipRow.name == key.chip,) if key.chip is not None else ()
    total = session.scalar(
        select(func.count())
        .select_from(PromotionRow)
        .join(ChipRow, ChipRow.id == PromotionRow.chip_id)
        .where(*where, *chip_filter)
    )
    rows = session.execute(
        select(
            PromotionRow.id,
            PromotionRow.promoted_at,
            ChipRow.name.label("chip"),
            PromotionRow.kernel_version,
            PromotionRow.config,
            PromotionRow.median_ms,
            PromotionRow.previous_ms,
            PromotionRow.default_ms,
            PromotionRow.job_id,
            PromotionRow.trial_id,
            SoftwareRow.fingerprint,
        )
        .join(ChipRow, ChipRow.id == PromotionRow.chip_id)
        .outerjoin(SoftwareRow, SoftwareRow.id == PromotionRow.software_id)
        .where(*where, *chip_filter)
        .order_by(PromotionRow.promoted_at.desc(), PromotionRow.id.desc())
        .limit(HISTORY_LIMIT)
    ).all()
    return list(reversed(rows)), total or 0


def history_table(rows: list[Any]) -> Table:
    """The promotions read, newest first."""
    columns = [
        Column("promoted_at", "Promoted", "when"),
        Column("chip", "Chip"),
        Column("kernel_version", "Version", "number"),
        Column("software", "Software"),
        Column("median_ms", "Best", "ms"),
        Column("previous_ms", "Before", "ms"),
        Column("default_ms", "Default", "ms"),
        Column("speedup", "Speedup", "speedup"),
        Column("config", "Config", "config"),
        Column("job", "Job"),
    ]
    table_rows = [
        {
            "promoted_at": aware(row.promoted_at),
            "chip": row.chip,
            "kernel_version": row.kernel_version,
            "software": short_fingerprint(row.fingerprint),
            "median_ms": row.median_ms,
            "previous_ms": row.previous_ms,
            "default_ms": row.default_ms,
            "speedup": speedup(row.default_ms, row.median_ms),
            "config": row.config,
            "job": job_link(row.job_id),
        }
        for row in reversed(rows)
    ]
    return Table("history", columns, table_rows, empty="this key was never promoted")


def history_figure(rows: list[Any]) -> dict[str, Any]:
    """Each promotion as a point over time, one trace per (chip, kernel version, software); per chip
    a dashed trace of the default's time at each promotion."""
    groups: dict[tuple[str, int, str], dict[str, Any]] = {}
    defaults: dict[str, dict[str, Any]] = {}
    for row in rows:
        when = aware(row.promoted_at).isoformat()
        software = short_fingerprint(row.fingerprint) or "unknown software"
        group = (row.chip, row.kernel_version, software)
        trace = groups.get(group)
        if trace is None:
            trace = groups[group] = {
                "type": "scatter",
                "mode": "lines+markers",
                "name": f"{row.chip} · v{row.kernel_version} · {software}",
                "x": [],
                "y": [],
                "text": [],
                "meta": {"chip": row.chip, "kernel_version": row.kernel_version, "role": "best"},
            }
        trace["x"].append(when)
        trace["y"].append(row.median_ms)
        trace["text"].append(" ".join(f"{k}={v}" for k, v in row.config.items()))
        if row.default_ms is not None:
            default = defaults.setdefault(
                row.chip,
                {
                    "type": "scatter",
                    "mode": "lines+markers",
                    "line": {"dash": "dash", "width": 1},
                    "marker": {"symbol": "circle-open"},
                    "name": f"{row.chip} · default rule",
                    "x": [],
                    "y": [],
                    "meta": {"chip": row.chip, "role": "default"},
                },
            )
            default["x"].append(when)
            default["y"].append(row.default_ms)
    times = [row.median_ms for row in rows if row.median_ms > 0]
    times += [row.default_ms for row in rows if row.default_ms is not None and row.default_ms > 0]
    log = bool(times) and max(times) / min(times) > LOG_SPREAD
    layout = {
        "xaxis": {"title": {"text": "promoted at (UTC)"}, "type": "date"},
        "yaxis": {**(LOG_AXIS if log else {"type": "linear"}), "title": {"text": "median time (ms)"}},
        "hovermode": "closest",
    }
    return figure([*groups.values(), *defaults.values()], layout)


def neighbours_table(snapshot: Snapshot | None, key: Key) -> Table:
    """Per chip, the :data:`NEIGHBOURS` tuned shapes nearest the key (same kernel version and dtype),
    from the in-memory index, nearest first; the key itself is not its own neighbour."""
    candidates: dict[str, list[tuple[Shape, str, Any]]] = defaultdict(list)
    if snapshot is not None:
        for (kernel, version, shape_key, dtype, chip), entry in snapshot.entries.items():
            if (
                kernel == key.spec.name
                and version == key.spec.version
                and dtype == key.dtype
                and shape_key != key.shape_key
                and (key.chip is None or chip == key.chip)
            ):
                candidates[chip].append((entry_shape(entry), shape_key, entry))
    categorical = {dim.name for dim in key.spec.dims if dim.categorical}
    rows = []
    for chip in sorted(candidates):
        for distance, entry in nearest(key.shape, candidates[chip], categorical, NEIGHBOURS):
            best = entry_best(entry)
            rows.append(
                {
                    "chip": chip,
                    "shape": Link(best.shape_key, shape_url(best.kernel, best.shape_key, best.dtype)),
                    "distance": readable(distance) if math.isfinite(distance) else None,
                    "best_ms": best.median_ms,
                    "speedup": best.speedup_vs_default,
                    "config": best.config,
                }
            )
    columns = [
        Column("chip", "Chip"),
        Column("shape", "Shape"),
        Column("distance", "Distance", "number"),
        Column("best_ms", "Best", "ms"),
        Column("speedup", "Speedup", "speedup"),
        Column("config", "Config", "config"),
    ]
    return Table("neighbours", columns, rows, empty="no other shape of this kernel and dtype is tuned")


def _read(db: Database, key: Key) -> tuple[Table, list[Any], int]:
    with db.read() as session:
        best = best_table(session, key)
        rows, total = history_rows(session, key)
    return best, rows, total


@router.get("/kernels/{kernel}/shapes/{shape_key}")
async def shape_page(
    kernel: str,
    shape_key: str,
    request: Request,
    *,
    viewer: ViewerDep,
    db: DatabaseDep,
    reads: ReadsDep,
    dtype: str = "float32",
    chip: str | None = None,
    format: Format = "html",
    table: str | None = None,
) -> Response:
    """The shape page (see the module docstring); ``format=csv|json`` downloads a table."""
    key = parse_page_key(kernel, shape_key, dtype, chip)
    snapshot = await reads.index.current()
    best, rows, total = await run_in_threadpool(_read, db, key)
    tables = [best, history_table(rows), neighbours_table(snapshot, key)]
    if format != "html":
        return download(pick(tables, table), format)
    context = {
        "key": key,
        "spec": key.spec,
        "best": tables[0],
        "history": tables[1],
        "neighbours": tables[2],
        "history_chart": history_figure(rows),
        "history_total": total,
        "history_shown": len(tables[1].rows),
        "dtypes": DTYPES,
        "kernel_url": f"/kernels/{key.spec.name}",
    }
    return render(request, viewer, "shape.html", context)
