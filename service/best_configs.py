"""Reads over best configs that the dashboard's pages share: speedups, staleness, a kernel's rows, a key's.

- The **speedup** of a best is ``default_ms / median_ms`` (:data:`SPEEDUP`, in SQL so it sorts
  there); :func:`median_speedups` is its median per (kernel, chip), a window in SQL.
- A best is **stale** when it was measured with other software than its chip's newest (the
  software its workers registered last: :func:`newest_software`, which is
  :func:`tiletune.service.fleet.newest_software_id` for every chip at once) or with another
  version of the kernel than ``version``, the one installed here: :func:`stale_condition` in
  SQL, :func:`stale_reason` for a row read.
- A kernel's bests, filtered (:class:`BestFilters`), sorted and paged in SQL
  (:func:`kernel_bests`), per chip (:func:`chip_counts`), and the chips and dtypes it has
  (:func:`kernel_choices`); one key's bests on every chip (:func:`key_bests`).

Functions of a session; they read, never write, and none reads more than one page of best configs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, Row, Select, Subquery, and_, case, func, or_, select, true
from sqlalchemy.orm import InstrumentedAttribute, Session

from tiletune.service.models import BestConfigRow, ChipRow, SoftwareRow

SelectT = TypeVar("SelectT", bound=Select[*tuple[Any, ...]])

#: A best config's speedup over the default rule, computed in SQL.
SPEEDUP = (BestConfigRow.default_ms / BestConfigRow.median_ms).label("speedup")

#: The columns a kernel's bests sort by, and the SQL each sorts on.
SORTS: dict[str, ColumnElement[Any] | InstrumentedAttribute[Any]] = {
    "shape": BestConfigRow.shape_key,
    "dtype": BestConfigRow.dtype,
    "chip": ChipRow.name,
    "best_ms": BestConfigRow.median_ms,
    "default_ms": BestConfigRow.default_ms,
    "speedup": BestConfigRow.default_ms / BestConfigRow.median_ms,
    "promoted_at": BestConfigRow.promoted_at,
}

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


def stale_condition(version: int, newest: Subquery) -> ColumnElement[bool]:
    """SQL true for a best measured with other software than its chip's newest, or another kernel version."""
    other_software = and_(
        newest.c.software_id.is_not(None), BestConfigRow.software_id.is_distinct_from(newest.c.software_id)
    )
    return or_(BestConfigRow.kernel_version != version, other_software)


def stale_reason(
    version: int, kernel_version: int, software_id: int | None, newest_id: int | None
) -> str | None:
    """Why a best is stale (``software``, ``kernel v1 → v2``, or both), ``None`` when it is current."""
    reasons = []
    if newest_id is not None and software_id != newest_id:
        reasons.append("software")
    if kernel_version != version:
        reasons.append(f"kernel v{kernel_version} → v{version}")
    return "; ".join(reasons) or None


def median_speedups(kernel: str | None = None) -> Subquery:
    """Per (kernel, chip id): the median of ``default_ms / median_ms`` over its best configs.

    Taken in SQL: the cell's rows ranked by speedup in a window, the middle one (or the mean of
    the middle two) kept. ``kernel`` narrows it to one kernel's cells.
    """
    cell = (BestConfigRow.kernel, BestConfigRow.chip_id)
    ranked = (
        select(
            BestConfigRow.kernel,
            BestConfigRow.chip_id,
            SPEEDUP,
            func.row_number().over(partition_by=cell, order_by=SPEEDUP).label("rank"),
            func.count().over(partition_by=cell).label("n"),
        )
        .where(BestConfigRow.default_ms.is_not(None), BestConfigRow.median_ms > 0)
        .where(BestConfigRow.kernel == kernel if kernel is not None else true())
        .subquery()
    )
    middle = and_(ranked.c.rank * 2 >= ranked.c.n, ranked.c.rank * 2 <= ranked.c.n + 2)
    return (
        select(ranked.c.kernel, ranked.c.chip_id, func.avg(ranked.c.speedup).label("median"))
        .where(middle)
        .group_by(ranked.c.kernel, ranked.c.chip_id)
        .subquery()
    )


@dataclass(frozen=True)
class BestFilters:
    """Which of a kernel's bests to read (empty means any): a chip, a dtype, a substring of the
    shape key, only stale ones."""

    chip: str | None = None
    dtype: str | None = None
    q: str | None = None
    stale: bool = False


def _filtered(query: SelectT, kernel: str, version: int, where: BestFilters, newest: Subquery) -> SelectT:
    query = query.where(BestConfigRow.kernel == kernel)
    if where.chip is not None:
        query = query.where(ChipRow.name == where.chip)
    if where.dtype is not None:
        query = query.where(BestConfigRow.dtype == where.dtype)
    if where.q is not None:
        query = query.where(BestConfigRow.shape_key.contains(where.q, autoescape=True))
    if where.stale:
        query = query.where(stale_condition(version, newest))
    return query


@dataclass(frozen=True)
class BestsPage:
    """One page of a kernel's bests and how many match in all."""

    rows: Sequence[Row[*tuple[Any, ...]]]
    total: int


def kernel_bests(
    session: Session,
    kernel: str,
    version: int,
    where: BestFilters,
    *,
    sort: str,
    descending: bool,
    limit: int,
    offset: int,
) -> BestsPage:
    """One page of ``kernel``'s bests (every chip, dtype and kernel version), sorted by ``sort``
    (a key of :data:`SORTS`; unknown values last), then by key; each row has its chip, speedup,
    software fingerprint and its chip's newest software id (``newest_id``)."""
    newest = newest_software()
    joined = select(BestConfigRow.id).join(ChipRow, ChipRow.id == BestConfigRow.chip_id)
    joined = joined.outerjoin(newest, newest.c.chip_id == BestConfigRow.chip_id)
    counted = _filtered(joined, kernel, version, where, newest).subquery()
    total = session.scalar(select(func.count()).select_from(counted))
    order = SORTS[sort]
    query = select(
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
    query = (
        query.join(ChipRow, ChipRow.id == BestConfigRow.chip_id)
        .outerjoin(newest, newest.c.chip_id == BestConfigRow.chip_id)
        .outerjoin(SoftwareRow, SoftwareRow.id == BestConfigRow.software_id)
    )
    rows = session.execute(
        _filtered(query, kernel, version, where, newest)
        .order_by(
            order.is_(None),  # unknown values last, whichever the direction and the database
            order.desc() if descending else order.asc(),
            BestConfigRow.shape_key,
            BestConfigRow.dtype,
            ChipRow.name,
            BestConfigRow.id,
        )
        .limit(limit)
        .offset(offset)
    ).all()
    return BestsPage(rows, total or 0)


def chip_counts(session: Session, kernel: str, version: int) -> Sequence[Row[*tuple[Any, ...]]]:
    """Per chip ``kernel`` is tuned on, by name: ``name``, keys ``tuned``, how many are ``stale``,
    and the ``median`` speedup over the default."""
    newest = newest_software()
    stale = func.sum(case((stale_condition(version, newest), 1), else_=0))
    counts = (
        select(BestConfigRow.chip_id, func.count().label("tuned"), stale.label("stale"))
        .outerjoin(newest, newest.c.chip_id == BestConfigRow.chip_id)
        .where(BestConfigRow.kernel == kernel)
        .group_by(BestConfigRow.chip_id)
        .subquery()
    )
    medians = median_speedups(kernel)
    return session.execute(
        select(ChipRow.name, counts.c.tuned, counts.c.stale, medians.c.median)
        .join(counts, counts.c.chip_id == ChipRow.id)
        .outerjoin(medians, medians.c.chip_id == ChipRow.id)
        .order_by(ChipRow.name)
    ).all()


def kernel_choices(session: Session, kernel: str) -> tuple[list[str], list[str]]:
    """The chips and dtypes ``kernel`` has best configs on, each sorted."""
    of_kernel = BestConfigRow.kernel == kernel
    chip_ids = select(BestConfigRow.chip_id).where(of_kernel).distinct()
    chips = session.scalars(select(ChipRow.name).where(ChipRow.id.in_(chip_ids)).order_by(ChipRow.name)).all()
    dtypes = session.scalars(
        select(BestConfigRow.dtype).where(of_kernel).distinct().order_by(BestConfigRow.dtype)
    ).all()
    return list(chips), list(dtypes)


def key_bests(
    session: Session, kernel: str, shape_key: str, dtype: str, chip: str | None = None
) -> Sequence[Row[*tuple[Any, ...]]]:
    """One key's bests on each chip (or on ``chip``), every kernel version the store holds, by chip
    then newest version first; with provenance (job, trial, software, its chip's newest ``newest_id``)."""
    newest = newest_software()
    query = (
        select(
            ChipRow.name.label("chip"),
            BestConfigRow.kernel_version,
            BestConfigRow.config,
            BestConfigRow.median_ms,
            BestConfigRow.default_config,
            BestConfigRow.default_ms,
            BestConfigRow.job_id,
            BestConfigRow.trial_id,
            BestConfigRow.software_id,
            newest.c.software_id.label("newest_id"),
            SoftwareRow.fingerprint,
            BestConfigRow.promoted_at,
        )
        .join(ChipRow, ChipRow.id == BestConfigRow.chip_id)
        .outerjoin(newest, newest.c.chip_id == BestConfigRow.chip_id)
        .outerjoin(SoftwareRow, SoftwareRow.id == BestConfigRow.software_id)
        .where(
            BestConfigRow.kernel == kernel,
            BestConfigRow.shape_key == shape_key,
            BestConfigRow.dtype == dtype,
        )
        .order_by(ChipRow.name, BestConfigRow.kernel_version.desc())
    )
    if chip is not None:
        query = query.where(ChipRow.name == chip)
    return session.execute(query).all()
