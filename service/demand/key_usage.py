"""Launches per key: what re-tuning (:mod:`tiletune.service.demand.retune`) ranks stale keys by.

Contract (one suite of tests runs it on SQLite and PostgreSQL):

- A key is (kernel, the registry's version of it, canonical shape, dtype, chip name):
  :data:`UsageKey`. :class:`KeyUsage` counts launches of keys in memory: each exact lookup this
  replica answers (:meth:`KeyUsage.count`, on the event loop: one locked ``dict`` update, never a
  metric label) and the per-key counts clients send with their stats
  (:meth:`KeyUsage.count_reported`: entries whose kernel, shape or dtype this server cannot read
  are passed over, never an error: a client of a plugin kernel keeps its stats).
- It holds at most :data:`MAX_KEYS` keys between flushes; a key beyond that is not counted until
  the next flush (the counts rank keys, they are not accounts).
- :meth:`KeyUsage.flush` adds the counts taken since the last flush to the ``key_usage`` table of
  the keys' chips (a chip nobody registered is dropped) by one bulk upsert per transaction
  (``launches = launches + n``, capped at :data:`MAX_LAUNCHES`, ``last_seen_at`` the database's
  clock), so replicas flushing at once neither lose counts nor deadlock; a flush that fails gives
  its counts back for the next. The server flushes from its reaper loop and before each re-tuning.
- :func:`launches` is the SQL of a key's launches on a chip: its usage plus its misses.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Sequence

from sqlalchemy import BigInteger, ColumnElement, ScalarSelect, case, cast, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import InstrumentedAttribute, Session

from tiletune.client.wire import KeyLaunches
from tiletune.service.database import Database
from tiletune.service.errors import InvalidInputError, NotFoundError
from tiletune.service.models import BestConfigRow, ChipRow, KeyUsageRow, MissRow
from tiletune.service.specs import check_dtype, lookup_kernel, parse_shape

#: (kernel, kernel version, canonical shape, dtype, chip name).
UsageKey = tuple[str, int, str, str, str]

#: The most keys counted in memory between two flushes.
MAX_KEYS = 100_000
#: A key's launches stop growing here (a BIGINT holds it).
MAX_LAUNCHES = 2**62
#: The most keys one transaction of a flush adds.
FLUSH_CHUNK_KEYS = 1000


class KeyUsage:
    """Launches per key counted in memory, flushed to the store; see the module docstring."""

    def __init__(self, max_keys: int = MAX_KEYS) -> None:
        self.max_keys = max_keys
        self._counts: Counter[UsageKey] = Counter()
        self._lock = threading.Lock()

    def count(self, key: UsageKey, launches: int = 1) -> None:
        """Count ``launches`` of ``key`` (a key past :attr:`max_keys` waits for the next flush)."""
        with self._lock:
            counts = self._counts
            if key in counts or len(counts) < self.max_keys:
                counts[key] += launches

    def count_reported(self, chip: str, entries: Iterable[KeyLaunches]) -> int:
        """Count a client's per-key launches on ``chip``; how many entries were counted (the others
        name a kernel, shape or dtype this server cannot read)."""
        counted = 0
        for entry in entries:
            try:
                spec = lookup_kernel(entry.kernel)
                shape = parse_shape(spec, entry.shape, "shape")
                check_dtype(entry.dtype, "dtype")
            except (InvalidInputError, NotFoundError):
                continue
            self.count((spec.name, spec.version, spec.canonical_shape(shape), entry.dtype, chip), entry.count)
            counted += 1
        return counted

    def pending(self) -> dict[UsageKey, int]:
        """The counts not flushed yet (a copy)."""
        with self._lock:
            return dict(self._counts)

    def take(self) -> dict[UsageKey, int]:
        """The counts since the last take, handed over (the counter starts again from none)."""
        with self._lock:
            taken, self._counts = self._counts, Counter()
        return dict(taken)

    def give_back(self, counts: dict[UsageKey, int]) -> None:
        """Count again what a failed flush took."""
        with self._lock:
            self._counts.update(counts)

    def flush(self, db: Database) -> int:
        """Add the counts since the last flush to the store; how many keys it wrote."""
        counts = self.take()
        if not counts:
            return 0
        try:
            return write_usage(db, counts)
        except Exception:
            self.give_back(counts)
            raise


def write_usage(db: Database, counts: dict[UsageKey, int]) -> int:
    """Add ``counts`` to ``key_usage`` (keys of unregistered chips dropped); the keys written."""
    with db.read() as session:
        names = {key[4] for key in counts}
        chip_ids = dict(
            session.execute(select(ChipRow.name, ChipRow.id).where(ChipRow.name.in_(names))).all()
        )
    rows = [
        {
            "chip_id": chip_ids[chip],
            "kernel": kernel,
            "kernel_version": version,
            "shape_key": shape_key,
            "dtype": dtype,
            "launches": min(launches, MAX_LAUNCHES),
        }
        for (kernel, version, shape_key, dtype, chip), launches in sorted(counts.items())
        if chip in chip_ids
    ]
    for start in range(0, len(rows), FLUSH_CHUNK_KEYS):
        with db.write() as session:
            _upsert(session, rows[start : start + FLUSH_CHUNK_KEYS], db)
    return len(rows)


def _upsert(session: Session, rows: Sequence[dict[str, object]], db: Database) -> None:
    now = db.clock()
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    insert = dialect.insert(KeyUsageRow)
    excluded = insert.excluded
    upsert = insert.on_conflict_do_update(
        index_elements=["chip_id", "kernel", "kernel_version", "shape_key", "dtype"],
        set_={
            "launches": case(
                (
                    cast(KeyUsageRow.launches, BigInteger) >= MAX_LAUNCHES - excluded.launches,
                    MAX_LAUNCHES,
                ),
                else_=KeyUsageRow.launches + excluded.launches,
            ),
            "last_seen_at": excluded.last_seen_at,
        },
    )
    session.execute(upsert, [{**row, "last_seen_at": now} for row in rows])


def launches(chip_id: int) -> ColumnElement[int]:
    """SQL of the launches of the best config row's key on ``chip_id`` (a correlated scalar over
    ``best_configs``): its usage plus its misses (a key missed before it was tuned)."""
    usage = _key_total(KeyUsageRow, KeyUsageRow.launches, chip_id)
    missed = _key_total(MissRow, MissRow.count, chip_id)
    return (usage + missed).label("launches")


def _key_total(
    row: type[KeyUsageRow] | type[MissRow], counted: InstrumentedAttribute[int], chip_id: int
) -> ScalarSelect[int]:
    """The sum of ``counted`` over ``row``'s rows of the best config row's key on ``chip_id``."""
    return (
        select(func.coalesce(func.sum(counted), 0))
        .where(
            row.chip_id == chip_id,
            row.kernel == BestConfigRow.kernel,
            row.kernel_version == BestConfigRow.kernel_version,
            row.shape_key == BestConfigRow.shape_key,
            row.dtype == BestConfigRow.dtype,
        )
        .scalar_subquery()
    )
