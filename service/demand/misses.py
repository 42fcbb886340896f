"""Misses: the keys clients asked for that nobody tuned, counted as clients report them.

A client whose lookup answered ``nearest`` or ``default`` reports the key (off the launch path,
in batches); the keys reported most queue jobs that tune them (:mod:`tiletune.service.demand.policy`),
and a person may queue chosen ones (:mod:`tiletune.service.demand.selected_misses`).

Contract (one suite of tests runs it on SQLite and PostgreSQL):

- ``report(batch)`` checks every entry before writing anything: the kernel
  is registered, the shape is complete and valid for its spec, the dtype is
  known. A bad entry raises :class:`~tiletune.service.errors.InvalidInputError`
  naming it (``misses[2].shape.n``) and the batch changes nothing. Counting a
  legal key never fails because of tuning: a key whose bench would hold more than
  ``max_shape_bytes`` is counted like any other (demand never queues it).
- A key is (kernel, the registry's version of it, canonical shape, dtype,
  chip name). Each entry adds its ``count`` to its key (up to
  :data:`MAX_MISS_COUNT`, where it stays): a batch is a count, so sending one
  twice counts twice (no idempotency). The key keeps the last
  report's ``match``, its first and last report times (the database's clock)
  and the bytes a bench of it holds (``bench_bytes``). ``accepted`` is the
  batch's number of entries.
- Writes are bounded: the keys are added in sorted order by one bulk upsert per
  transaction of at most :data:`REPORT_CHUNK_KEYS` keys, one report (or demand pass) of a
  replica at a time (:mod:`tiletune.service.demand.miss_writer`). A batch is therefore not
  atomic against a database fault: a failure part way leaves the transactions
  already committed counted (a client's retry counts those keys twice).
- Misses on a chip no worker registered are counted (``chip_id`` NULL) but
  queue nothing: a chip's limits come only from its workers. The first
  report after the chip registered links the key to it.
- After each report a demand pass runs over the report's chips; the report's ``queued_jobs``
  are the jobs it queued for the batch's keys: empty when the budget is spent (a later pass may
  queue them: the key's ``job_id`` shows it).
- ``misses(chip, kernel, limit)`` lists the keys of the kernels' current
  versions, highest count first (then the most recently reported).

Concurrency: counts are added by upserts (``INSERT … ON CONFLICT DO UPDATE SET
count = count + n``) in sorted key order, so concurrent batches neither lose
counts nor deadlock.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

from sqlalchemy import BigInteger, case, cast, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from tiletune.client.wire import MissesCreate, MissesPublic, MissPublic, MissReport
from tiletune.kernels import KernelDeclaration, Shape, all_declarations
from tiletune.service.database import Database, aware
from tiletune.service.demand.miss_keys import KEY_COLUMNS, MissKey, current_versions
from tiletune.service.demand.miss_writer import MissWriter
from tiletune.service.demand.policy import Demand, MissPolicy
from tiletune.service.models import ChipRow, MissRow
from tiletune.service.specs import check_dtype, lookup_kernel, parse_shape

#: The most keys one transaction of a report adds (a bounded hold of SQLite's writer).
REPORT_CHUNK_KEYS = 1000
#: ``bench_bytes`` is stored up to this (a BIGINT holds it).
BENCH_BYTES_CAP = 2**62
#: A key's count stops growing here (the column is a 32-bit integer).
MAX_MISS_COUNT = 2**31 - 1

T = TypeVar("T")

#: Demand's policy unless the server's settings say otherwise.
DEFAULT_POLICY = MissPolicy()


@dataclass
class _Tally:
    """One key's reports within a batch, summed."""

    spec: KernelDeclaration
    shape: Shape
    shape_key: str
    dtype: str
    chip: str
    count: int
    match: str
    bench_bytes: int

    @property
    def key(self) -> MissKey:
        return (self.spec.name, self.spec.version, self.shape_key, self.dtype, self.chip)


class Misses:
    """Counts misses and runs demand passes after them; see the module docstring for the contract."""

    def __init__(self, db: Database, policy: MissPolicy = DEFAULT_POLICY) -> None:
        self.db = db
        self.policy = policy
        self._writer = MissWriter(db)
        self._demand = Demand(self._writer, policy)

    async def off_loop(self, work: Callable[[], T]) -> T:
        """``work()`` (a report) in a thread (:meth:`MissWriter.off_loop`)."""
        return await self._writer.off_loop(work)

    def report(self, batch: MissesCreate) -> MissesPublic:
        """Count a batch of misses (checked whole first) and run a demand pass over its chips."""
        tallies = self._tally(batch.misses)
        keys = sorted(tallies)
        with self._writer.turn():
            chip_ids = self._chip_ids({tally.chip for tally in tallies.values()})
            now = self.db.clock()
            for start in range(0, len(keys), REPORT_CHUNK_KEYS):
                with self._writer.write() as session:
                    self._add(
                        session,
                        [tallies[key] for key in keys[start : start + REPORT_CHUNK_KEYS]],
                        chip_ids,
                        now,
                    )
            queued = self._demand.run_pass(sorted(set(chip_ids.values())))
        return MissesPublic(
            accepted=len(batch.misses), queued_jobs=[job for key, job in queued if key in tallies]
        )

    def plan_demand(self, chip_ids: Collection[int] | None = None, wait: bool = True) -> list[int]:
        """A demand pass over ``chip_ids`` (every registered chip by default); the jobs it queued.

        With ``wait`` False it passes (nothing queued) while this replica writes a report on
        SQLite: that report runs a pass of its own, and the caller (the reaper) is not held up.
        """
        with self._writer.turn(wait) as mine:
            return [job for _, job in self._demand.run_pass(chip_ids)] if mine else []

    def misses(
        self, chip: str | None = None, kernel: str | None = None, limit: int = 100
    ) -> list[MissPublic]:
        """The keys of the kernels' current versions, highest count first; see the module docstring."""
        specs = [lookup_kernel(kernel)] if kernel is not None else list(all_declarations().values())
        query = select(MissRow).where(current_versions(specs))
        if chip is not None:
            query = query.where(MissRow.chip_name == chip)
        query = query.order_by(MissRow.count.desc(), MissRow.last_seen_at.desc(), MissRow.id).limit(limit)
        with self.db.read() as session:
            return [_public(row) for row in session.scalars(query)]

    # -- counting ---------------------------------------------------------------------------

    @staticmethod
    def _tally(entries: list[MissReport]) -> dict[MissKey, _Tally]:
        """Every entry checked (errors name ``misses[i]....``) and summed per key."""
        tallies: dict[MissKey, _Tally] = {}
        for index, entry in enumerate(entries):
            where = f"misses[{index}]"
            spec = lookup_kernel(entry.kernel, field=f"{where}.kernel")
            shape = parse_shape(spec, entry.shape, f"{where}.shape")
            check_dtype(entry.dtype, f"{where}.dtype")
            shape_key = spec.canonical_shape(shape)
            found = tallies.get((spec.name, spec.version, shape_key, entry.dtype, entry.chip))
            if found is not None:
                found.count = min(found.count + entry.count, MAX_MISS_COUNT)
                found.match = entry.match
                continue
            held = min(math.ceil(spec.allocated_bytes(shape, entry.dtype)), BENCH_BYTES_CAP)
            tally = _Tally(spec, shape, shape_key, entry.dtype, entry.chip, entry.count, entry.match, held)
            tallies[tally.key] = tally
        return tallies

    def _chip_ids(self, names: set[str]) -> dict[str, int]:
        """The registered chips among ``names``: name -> id."""
        with self.db.read() as session:
            found = session.execute(select(ChipRow.name, ChipRow.id).where(ChipRow.name.in_(names)))
            return dict(found.all())

    @staticmethod
    def _add(session: Session, tallies: Sequence[_Tally], chip_ids: dict[str, int], now: datetime) -> None:
        """Add each of ``tallies`` to its key's row (created if new): one bulk upsert."""
        rows = [
            {
                "kernel": tally.spec.name,
                "kernel_version": tally.spec.version,
                "shape": tally.shape,
                "shape_key": tally.shape_key,
                "dtype": tally.dtype,
                "chip_name": tally.chip,
                "chip_id": chip_ids.get(tally.chip),
                "count": tally.count,
                "last_match": tally.match,
                "first_seen_at": now,
                "last_seen_at": now,
                "bench_bytes": tally.bench_bytes,
            }
            for tally in tallies
        ]
        dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
        insert = dialect.insert(MissRow)
        excluded = insert.excluded
        upsert = insert.on_conflict_do_update(
            index_elements=list(KEY_COLUMNS),
            set_={
                "count": case(
                    (cast(MissRow.count, BigInteger) + excluded.count >= MAX_MISS_COUNT, MAX_MISS_COUNT),
                    else_=MissRow.count + excluded.count,
                ),
                "last_match": excluded.last_match,
                "last_seen_at": excluded.last_seen_at,
                "chip_id": func.coalesce(excluded.chip_id, MissRow.chip_id),
                "bench_bytes": excluded.bench_bytes,
            },
        )
        session.execute(upsert, rows)


def _public(row: MissRow) -> MissPublic:
    return MissPublic(
        kernel=row.kernel,
        shape=row.shape,
        shape_key=row.shape_key,
        dtype=row.dtype,
        chip=row.chip_name,
        count=row.count,
        job_id=row.job_id,
        first_seen_at=aware(row.first_seen_at),
        last_seen_at=aware(row.last_seen_at),
    )
