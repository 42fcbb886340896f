"""A miss's key in SQL: which misses are of the kernels' current versions, which rows share a
miss's key, and whether a key has a live job on its chip. Shared by the misses' counting
(:mod:`tiletune.service.demand.misses`), demand (:mod:`tiletune.service.demand.policy`) and a person's choice
(:mod:`tiletune.service.demand.selected_misses`).

A key is (kernel, kernel version, canonical shape, dtype, chip name): :data:`MissKey`.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import ColumnElement, and_, or_, select
from sqlalchemy.orm import Session

from tiletune.client.wire import LIVE_JOB_STATES
from tiletune.kernels import KernelDeclaration
from tiletune.service.models import BestConfigRow, JobRow, MissRow

#: The columns that identify a miss (its unique constraint).
KEY_COLUMNS = ("kernel", "kernel_version", "shape_key", "dtype", "chip_name")

MissKey = tuple[str, int, str, str, str]


def key_of(row: MissRow) -> MissKey:
    """The key of ``row``."""
    return (row.kernel, row.kernel_version, row.shape_key, row.dtype, row.chip_name)


def current_versions(specs: Iterable[KernelDeclaration]) -> ColumnElement[bool]:
    """Misses of ``specs`` at their registered versions."""
    return or_(*(and_(MissRow.kernel == s.name, MissRow.kernel_version == s.version) for s in specs))


def same_key(table: type[BestConfigRow] | type[JobRow]) -> tuple[ColumnElement[bool], ...]:
    """``table``'s kernel, version, shape and dtype equal to the miss row's (a correlated subquery's)."""
    return (
        table.kernel == MissRow.kernel,
        table.kernel_version == MissRow.kernel_version,
        table.shape_key == MissRow.shape_key,
        table.dtype == MissRow.dtype,
    )


def live_job(session: Session, row: MissRow, chip_id: int | None) -> bool:
    """True when a job of ``row``'s key is queued, running or validating on its chip (``chip_id``
    when registered, or its name as a job's target)."""
    on_chip = [JobRow.chip_target == row.chip_name]
    if chip_id is not None:
        on_chip.append(JobRow.chip_id == chip_id)
    found = session.scalar(
        select(JobRow.id)
        .where(
            JobRow.kernel == row.kernel,
            JobRow.kernel_version == row.kernel_version,
            JobRow.shape_key == row.shape_key,
            JobRow.dtype == row.dtype,
            JobRow.state.in_(LIVE_JOB_STATES),
            or_(*on_chip),
        )
        .limit(1)
    )
    return found is not None
