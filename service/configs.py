"""Best configs: keys, promotion, import, export, history, nearest tuned shapes. A repository.

Functions take the caller's session and never commit (see :mod:`tiletune.service.database`).

- :func:`promote` replaces a key's best config, appends to its history, and marks the
  transaction as one that changes best configs (the generation moves after its commit);
- :func:`import_configs` stores a bundle whose checksum matches its entries, after checking
  every entry (:func:`checked_entry`: the kernel exists at that version, the shape is
  complete and its key is the server's, the dtype is known, the config lies in the kernel's
  space and is valid on the chip's limits, so does the default config (or it is the kernel's
  own default rule for the key, which a chip's limits may refuse), the times are finite and
  positive, the software it ran with is given and bounded as a worker's registration bounds it
  (:data:`~tiletune.client.wire.Software`): one bad entry refuses the bundle and nothing changes. An entry
  replaces a key's best only when the key has none or the entry is faster, and a best
  measured on this server (by a job) only with ``force``; it is recorded in the history
  like a promotion (no job);
- :func:`best_configs` is a chip's bulk export in one query; :func:`exact_public` one key;
- :func:`nearest_best` (nearest tuned shapes on one chip) and :func:`other_chips_best` (the same
  key on other chips) are what a new job's search is warm-started from.
"""

from __future__ import annotations

import dataclasses
import hmac
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import TypeAdapter, ValidationError
from sqlalchemy import func, select
from sqlalchemy import text as sql_text
from sqlalchemy.orm import Session

from tiletune.client.nearest import nearest
from tiletune.client.wire import MAX_MS, MIN_MS, BestConfigPublic, ConfigBundle, HistoryPoint, Software
from tiletune.kernels import Config, KernelDeclaration, Shape
from tiletune.kernels.errors import InputError
from tiletune.service.database import configs_changed
from tiletune.service.errors import InvalidInputError
from tiletune.service.fleet import (
    chip_by_name,
    chip_limits,
    fingerprint_text,
    newest_software_id,
    software_row,
)
from tiletune.service.models import BestConfigRow, ChipRow, JobRow, PromotionRow, SoftwareRow, TrialRow
from tiletune.service.specs import check_dtype, lookup_kernel, parse_shape
from tiletune.service.views import best_public, history_point

#: An imported entry's software, checked as a worker's registration checks it.
SOFTWARE: TypeAdapter[dict[str, str | None]] = TypeAdapter(Software)


@dataclass(frozen=True)
class JobKey:
    """What identifies a tuning result: kernel, version, canonical shape, dtype, chip."""

    kernel: str
    kernel_version: int
    shape_key: str
    dtype: str
    chip_id: int

    @classmethod
    def of(cls, job: JobRow) -> JobKey:
        """The key a job tunes (the job is bound to its chip)."""
        assert job.chip_id is not None
        return cls(job.kernel, job.kernel_version, job.shape_key, job.dtype, job.chip_id)


@dataclass(frozen=True)
class Winner:
    """A config to promote for a key, with its measurement and provenance."""

    shape: dict[str, int]
    config: dict[str, int]
    median_ms: float
    default_config: dict[str, int] | None = None
    default_ms: float | None = None
    job_id: int | None = None
    trial_id: int | None = None
    software_id: int | None = None


def best_row(session: Session, key: JobKey) -> BestConfigRow | None:
    """The best config of ``key``, if one was promoted."""
    return session.scalar(
        select(BestConfigRow).where(
            BestConfigRow.kernel == key.kernel,
            BestConfigRow.kernel_version == key.kernel_version,
            BestConfigRow.shape_key == key.shape_key,
            BestConfigRow.dtype == key.dtype,
            BestConfigRow.chip_id == key.chip_id,
        )
    )


def tuned_on_software(session: Session, key: JobKey, software_id: int | None) -> bool:
    """True when ``key`` has a best config measured with ``software_id``."""
    best = best_row(session, key)
    return best is not None and software_id is not None and best.software_id == software_id


def tuned_on_newest_software(session: Session, key: JobKey) -> bool:
    """True when ``key`` has a best config measured with the chip's newest software."""
    return tuned_on_software(session, key, newest_software_id(session, key.chip_id))


def promote(session: Session, key: JobKey, winner: Winner, now: datetime) -> BestConfigRow:
    """Make ``winner`` the best config of ``key`` and append it to the history."""
    best = _promoted(session, key, winner, now, best_row(session, key))
    session.flush()
    return best


def _promoted(
    session: Session, key: JobKey, winner: Winner, now: datetime, best: BestConfigRow | None
) -> BestConfigRow:
    """:func:`promote` onto ``best``, the key's row as the caller read it (``None``: it has none);
    not flushed."""
    previous_ms = best.median_ms if best is not None else None
    if best is None:
        best = BestConfigRow(
            kernel=key.kernel,
            kernel_version=key.kernel_version,
            shape_key=key.shape_key,
            dtype=key.dtype,
            chip_id=key.chip_id,
        )
        session.add(best)
    fields = {
        "config": winner.config,
        "median_ms": winner.median_ms,
        "default_ms": winner.default_ms,
        "job_id": winner.job_id,
        "trial_id": winner.trial_id,
        "software_id": winner.software_id,
        "promoted_at": now,
    }
    for name, value in fields.items():
        setattr(best, name, value)
    best.shape = winner.shape
    best.default_config = winner.default_config
    session.add(PromotionRow(**dataclasses.asdict(key), **fields, previous_ms=previous_ms))
    configs_changed(session)
    return best


def checked_entry(
    entry: BestConfigPublic, index: int, chip: ChipRow | None
) -> tuple[JobKey, Winner, ChipRow]:
    """The key and winner of an imported entry on ``chip`` (the row its chip's name names, if any);
    :class:`InvalidInputError` naming ``configs[i].FIELD``."""
    where = f"configs[{index}]"
    if chip is None:
        raise InvalidInputError(f"unknown chip {entry.chip!r}: register a worker first", f"{where}.chip")
    spec = lookup_kernel(entry.kernel, f"{where}.kernel")
    if entry.kernel_version != spec.version:
        raise InvalidInputError(
            f"{spec.name} is version {spec.version} here, not {entry.kernel_version}",
            f"{where}.kernel_version",
        )
    shape = parse_shape(spec, entry.shape, f"{where}.shape")
    dtype = check_dtype(entry.dtype, f"{where}.dtype")
    config = _parsed_config(spec, entry.config, shape, chip, f"{where}.config")
    _check_runs_on(spec, config, shape, dtype, chip=chip, field=f"{where}.config")
    _check_software(entry.software, f"{where}.software")
    for name in ("median_ms", "default_ms"):
        value = getattr(entry, name)
        if value is not None and not (math.isfinite(value) and MIN_MS <= value <= MAX_MS):
            raise InvalidInputError(
                f"must be a finite time from {MIN_MS:g} to {MAX_MS:g} ms", f"{where}.{name}"
            )
    default = None
    if entry.default_config is not None:
        default = _parsed_config(spec, entry.default_config, shape, chip, f"{where}.default_config")
        if default != spec.default_config(shape, dtype, chip_limits(chip)):
            _check_runs_on(spec, default, shape, dtype, chip=chip, field=f"{where}.default_config")
    key = JobKey(spec.name, spec.version, spec.canonical_shape(shape), dtype, chip.id)
    winner = Winner(shape, config, entry.median_ms, default, entry.default_ms)
    return key, winner, chip


def _parsed_config(
    spec: KernelDeclaration, raw: dict[str, int], shape: Shape, chip: ChipRow, field: str
) -> Config:
    """``raw`` as one of the kernel's configs for ``shape`` on ``chip``; :class:`InvalidInputError`
    naming ``field``."""
    try:
        return spec.parse_config(raw, shape, chip_limits(chip))
    except InputError as error:
        raise InvalidInputError(error.reason, error.field.replace("config", field, 1)) from error


def _check_runs_on(
    spec: KernelDeclaration, config: Config, shape: Shape, dtype: str, *, chip: ChipRow, field: str
) -> None:
    """:class:`InvalidInputError` naming ``field`` unless ``config`` may run on ``chip`` (its limits)."""
    invalid = spec.config_problem(config, shape, dtype, chip_limits(chip))
    if invalid is not None:
        raise InvalidInputError(f"the config is invalid on {chip.name}: {invalid}", field)


def _check_software(software: dict[str, str | None], field: str) -> None:
    """:class:`InvalidInputError` naming ``field`` unless ``software`` is a fingerprint a worker could
    register (:data:`~tiletune.client.wire.Software`: names, printable bounded versions, few) and not empty.

    The message never repeats what was sent (it may be megabytes, or text that misleads a terminal).
    """
    try:
        SOFTWARE.validate_python(software)
    except ValidationError as error:
        reason = error.errors(include_url=False, include_input=False)[0]["msg"]
        raise InvalidInputError(f"not a software fingerprint workers send: {reason}", field) from None
    if not software:
        raise InvalidInputError("an entry needs its provenance: the software it was measured with", field)


def import_configs(session: Session, bundle: ConfigBundle, now: datetime, force: bool = False) -> int:
    """Store a checked bundle (see the module docstring); how many of its entries changed a key's best.

    Every entry is checked first, then the bundle's checksum against its entries. The chips, the
    keys' best rows and the software rows are read once per bundle, not per entry, and the
    changes are flushed once; on PostgreSQL a large import refreshes the tables' statistics
    (:data:`ANALYZE_AFTER`): an import costs its own size, whatever the store holds.
    """
    chips = {name: chip_by_name(session, name) for name in {entry.chip for entry in bundle.configs}}
    checked = [
        (entry, *checked_entry(entry, index, chips[entry.chip])) for index, entry in enumerate(bundle.configs)
    ]
    presented = (bundle.checksum or "").encode()  # bytes: a str of non-ASCII text cannot be compared
    if bundle.checksum is None or not hmac.compare_digest(presented, bundle.content_checksum().encode()):
        raise InvalidInputError(
            "the checksum is missing or does not match the entries (export again)", "checksum"
        )
    bests = _best_rows(session, [key for _, key, _, _ in checked])
    softwares: dict[tuple[int, str], SoftwareRow] = {}
    changed = 0
    for entry, key, winner, chip in checked:
        best = bests.get(key)
        if best is not None and (
            best.median_ms <= winner.median_ms or (best.job_id is not None and not force)
        ):
            continue
        held = (chip.id, fingerprint_text(entry.software))
        if held not in softwares:
            softwares[held] = software_row(session, chip.id, entry.software, now)
        provenanced = dataclasses.replace(winner, software_id=softwares[held].id)
        bests[key] = _promoted(session, key, provenanced, now, best)
        changed += 1
    session.flush()
    if changed >= ANALYZE_AFTER and session.get_bind().dialect.name == "postgresql":
        # The planner's statistics, until autovacuum's next pass, still describe the tables before
        # the import: it would scan the table for the next bundle's key reads and the index refresh.
        session.execute(sql_text("ANALYZE best_configs, promotions"))
    return changed


#: Changed keys from which an import on PostgreSQL refreshes the tables' statistics itself.
ANALYZE_AFTER = 1000


#: Shapes per query when an import reads its keys' best rows.
SHAPES_PER_QUERY = 500


def _best_rows(session: Session, keys: Sequence[JobKey]) -> dict[JobKey, BestConfigRow]:
    """The best rows of ``keys`` that have one: per kernel, version, dtype and chip, a query per
    :data:`SHAPES_PER_QUERY` shapes (equality on the unique index's other columns and ``IN`` on
    the shape: an index search; SQLite scans the table for an ``IN`` of whole keys)."""
    shapes: dict[tuple[str, int, str, int], set[str]] = {}
    for key in keys:
        shapes.setdefault((key.kernel, key.kernel_version, key.dtype, key.chip_id), set()).add(key.shape_key)
    found: dict[JobKey, BestConfigRow] = {}
    for (kernel, version, dtype, chip_id), shape_keys in shapes.items():
        ordered = sorted(shape_keys)
        for start in range(0, len(ordered), SHAPES_PER_QUERY):
            rows = session.scalars(
                select(BestConfigRow).where(
                    BestConfigRow.kernel == kernel,
                    BestConfigRow.kernel_version == version,
                    BestConfigRow.dtype == dtype,
                    BestConfigRow.chip_id == chip_id,
                    BestConfigRow.shape_key.in_(ordered[start : start + SHAPES_PER_QUERY]),
                )
            )
            for row in rows:
                found[JobKey(kernel, version, row.shape_key, dtype, chip_id)] = row
    return found


def exact_public(
    session: Session, spec: KernelDeclaration, shape_key: str, dtype: str, chip: str
) -> BestConfigPublic | None:
    """The best config of a key named by its chip's name, with provenance, in one query."""
    query = (
        select(BestConfigRow, SoftwareRow.fingerprint)
        .join(ChipRow, ChipRow.id == BestConfigRow.chip_id)
        .outerjoin(SoftwareRow, SoftwareRow.id == BestConfigRow.software_id)
        .where(
            ChipRow.name == chip,
            BestConfigRow.kernel == spec.name,
            BestConfigRow.kernel_version == spec.version,
            BestConfigRow.shape_key == shape_key,
            BestConfigRow.dtype == dtype,
        )
    )
    found = session.execute(query).first()
    if found is None:
        return None
    best, text = found
    return best_public(best, chip, json.loads(text) if text else {})


def best_configs(session: Session, chip: str, kernel: str | None = None) -> list[BestConfigPublic]:
    """Every best config of a chip (optionally one kernel), for bulk export and prefetch (one query)."""
    query = (
        select(BestConfigRow, SoftwareRow.fingerprint)
        .join(ChipRow, ChipRow.id == BestConfigRow.chip_id)
        .outerjoin(SoftwareRow, SoftwareRow.id == BestConfigRow.software_id)
        .where(ChipRow.name == chip)
    )
    if kernel is not None:
        query = query.where(BestConfigRow.kernel == kernel)
    fingerprints: dict[str | None, dict[str, str | None]] = {None: {}}
    entries = []
    for best, text in session.execute(query.order_by(BestConfigRow.kernel, BestConfigRow.shape_key)):
        if text not in fingerprints:
            fingerprints[text] = json.loads(text)
        entries.append(best_public(best, chip, fingerprints[text]))
    return entries


def nearest_best(
    session: Session, spec: KernelDeclaration, shape: dict[str, int], *, dtype: str, chip_id: int, k: int = 1
) -> list[tuple[float, BestConfigRow]]:
    """The ``k`` best configs of the nearest tuned shapes (same kernel version, dtype, chip)."""
    rows = session.scalars(
        select(BestConfigRow).where(
            BestConfigRow.kernel == spec.name,
            BestConfigRow.kernel_version == spec.version,
            BestConfigRow.dtype == dtype,
            BestConfigRow.chip_id == chip_id,
        )
    ).all()
    categorical = {dim.name for dim in spec.dims if dim.categorical}
    return nearest(shape, ((row.shape, row.shape_key, row) for row in rows), categorical, k)


def other_chips_best(
    session: Session, key: JobKey, *, chips: int, per_chip: int
) -> dict[str, list[dict[str, Any]]]:
    """The fastest configs of ``key`` (same kernel version, shape, dtype) on up to ``chips`` other chips.

    Per chip name: its best config, then the configs of the fastest measured search trials of the
    job that found it, up to ``per_chip`` in all, fastest first. Chips of the same kind as the
    key's come first, then the most recently promoted: a new chip starts from what its nearest
    relatives found, whose best region is often near its own.
    """
    kind = session.scalar(select(ChipRow.kind).where(ChipRow.id == key.chip_id))
    rows = session.execute(
        select(BestConfigRow, ChipRow.name)
        .join(ChipRow, ChipRow.id == BestConfigRow.chip_id)
        .where(
            BestConfigRow.kernel == key.kernel,
            BestConfigRow.kernel_version == key.kernel_version,
            BestConfigRow.shape_key == key.shape_key,
            BestConfigRow.dtype == key.dtype,
            BestConfigRow.chip_id != key.chip_id,
        )
        .order_by((ChipRow.kind == kind).desc(), BestConfigRow.promoted_at.desc(), BestConfigRow.id)
        .limit(chips)
    ).all()
    found: dict[str, list[dict[str, Any]]] = {}
    for row, chip in rows:
        trials: Sequence[dict[str, Any]] = ()
        if row.job_id is not None and per_chip > 1:
            trials = session.scalars(
                select(TrialRow.config)
                .where(
                    TrialRow.job_id == row.job_id, TrialRow.phase == "search", TrialRow.state == "measured"
                )
                .order_by(TrialRow.median_ms, TrialRow.id)
                .limit(per_chip)
            ).all()
        found[chip] = [row.config, *(config for config in trials if config != row.config)][:per_chip]
    return found


def history(
    session: Session, kernel: str, shape_key: str, dtype: str, chip: str | None = None
) -> list[HistoryPoint]:
    """Every promotion of a shape's best config, oldest first (across versions, software, chips)."""
    query = select(PromotionRow, ChipRow.name).join(ChipRow, ChipRow.id == PromotionRow.chip_id)
    query = query.where(PromotionRow.kernel == kernel)
    query = query.where(PromotionRow.shape_key == shape_key, PromotionRow.dtype == dtype)
    if chip is not None:
        query = query.where(ChipRow.name == chip)
    rows = session.execute(query.order_by(PromotionRow.promoted_at, PromotionRow.id))
    return [history_point(session, row, chip_name) for row, chip_name in rows]


def counts(session: Session) -> dict[str, Any]:
    """Jobs by state and the number of best configs (for /metrics and the dashboard)."""
    by_state = dict(session.execute(select(JobRow.state, func.count()).group_by(JobRow.state)).all())
    best = session.scalar(select(func.count()).select_from(BestConfigRow)) or 0
    return {"jobs": {str(k): int(v) for k, v in by_state.items()}, "best_configs": int(best)}
