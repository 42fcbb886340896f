"""Misses and demand-driven tuning: the keys clients asked for that nobody tuned.

A client whose lookup answered ``nearest`` or ``default`` reports the key
(off the launch path, in batches); the keys reported most queue jobs that tune
them, within the operator's demand budget.

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
  transaction of at most :data:`REPORT_CHUNK_KEYS` keys; a replica writes one
  report (or demand pass) at a time (on SQLite in one thread of its own:
  :meth:`Misses.off_loop`), and on SQLite it leaves the database's writer free for
  :data:`WRITER_YIELD_S` between two of its transactions, so a worker's heartbeat
  waits behind at most one bounded transaction. A batch is therefore not
  atomic against a database fault: a failure part way leaves the transactions
  already committed counted (a client's retry counts those keys twice).
- Misses on a chip no worker registered are counted (``chip_id`` NULL) but
  queue nothing: a chip's limits come only from its workers. The first
  report after the chip registered links the key to it.
- Demand (``threshold`` or ``jobs_per_chip_hour`` 0 turns it off) queues jobs in
  *passes*: one runs after each report (over the report's chips) and one from the
  server's reaper loop (over every chip: the hour slides on, live jobs end; skipped
  while the replica writes a report on SQLite). A key
  is eligible when its count is at least ``threshold``, its chip is registered, it
  is of the kernel's current version, its bench holds at most ``max_shape_bytes``,
  it has no best config on that chip for that version, no job of the key is live
  (``queued``, ``running``, ``validating``) on that chip, and no job was ever kept on
  it (demand's, or a person's from :func:`queue_selected`). The budget: per chip, at
  most ``jobs_per_chip_hour`` keys queued by demand within the hour before the pass
  (``demand_queued_at``, the database's clock: a sliding hour). When the budget is short the eligible keys
  with the highest count go first (then the most recently reported, then the
  oldest). Each job comes from a sweep named ``demand`` (that shape and dtype,
  ``chips=[chip]``, ``trials``, backend ``torch`` or else the kernel's first), made
  by the sweeps' rules and limits (:mod:`tiletune.service.jobs`: ``max_shape_bytes``,
  ``max_jobs_per_sweep``); its id and time are kept on the key. At most one demand
  job per key: one that failed or was cancelled is for a person to look at and
  submit again. A report's ``queued_jobs`` are the jobs the pass run right after it
  queued for the batch's keys: empty when the budget is spent (a later pass may
  queue them: the key's ``job_id`` shows it).
- ``misses(chip, kernel, limit)`` lists the keys of the kernels' current
  versions, highest count first (then the most recently reported).
- :func:`queue_selected` (a person's choice, the dashboard's misses page) queues
  one sweep named ``misses`` with one job per chosen key, whatever the policy and
  the budget, skipping keys of an old kernel version and keys with a live job on their
  chip; each queued job's id is kept on its key (replacing an earlier, finished one).

Concurrency: counts are added by upserts (``INSERT … ON CONFLICT DO UPDATE SET
count = count + n``) in sorted key order, so concurrent batches neither lose
counts nor deadlock. A pass counts a chip's budget and queues under a lock that
serialises passes over that chip across replicas: the chip's row (``SELECT … FOR
UPDATE``) on PostgreSQL, the writer lock on SQLite; it takes its keys ``FOR UPDATE
SKIP LOCKED`` (a key a report is counting this instant waits for the next pass) and
queues at most :data:`PASS_CHUNK_JOBS` jobs per transaction. Replicas sharing a store
together queue at most the budget.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypeVar

from fastapi.concurrency import run_in_threadpool
from pydantic import ValidationError
from sqlalchemy import BigInteger, ColumnElement, Select, and_, case, cast, func, or_, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from tiletune.client.wire import (
    LIVE_JOB_STATES,
    JobPublic,
    JobState,
    MissesCreate,
    MissesPublic,
    MissPublic,
    MissReport,
    SweepCreate,
    SweepKernel,
)
from tiletune.kernels import KernelSpec, Shape, all_kernels
from tiletune.service import jobs
from tiletune.service.database import Database, aware
from tiletune.service.errors import InvalidInputError
from tiletune.service.fleet import chip_by_name
from tiletune.service.models import BestConfigRow, ChipRow, JobRow, MissRow
from tiletune.service.specs import check_dtype, lookup_kernel, parse_shape

log = logging.getLogger("tiletune.service")

#: The name of the sweeps demand creates.
DEMAND_SWEEP = "demand"
#: The name of the sweeps a person queues from chosen misses (:func:`queue_selected`).
SELECTED_SWEEP = "misses"

#: The columns that identify a miss (its unique constraint).
KEY_COLUMNS = ("kernel", "kernel_version", "shape_key", "dtype", "chip_name")

#: The most keys one transaction of a report adds (a bounded hold of SQLite's writer).
REPORT_CHUNK_KEYS = 1000
#: The most demand jobs one transaction of a pass queues.
PASS_CHUNK_JOBS = 20
#: Seconds a replica leaves SQLite's writer free between two of its misses transactions: longer
#: than the longest sleep of SQLite's busy handler (100 ms), so a writer waiting gets its turn.
WRITER_YIELD_S = 0.15
#: The window of the demand budget.
DEMAND_WINDOW = timedelta(hours=1)
#: ``bench_bytes`` is stored up to this (a BIGINT holds it).
BENCH_BYTES_CAP = 2**62
#: A key's count stops growing here (the column is a 32-bit integer).
MAX_MISS_COUNT = 2**31 - 1

MissKey = tuple[str, int, str, str, str]
T = TypeVar("T")


@dataclass(frozen=True)
class MissPolicy:
    """When misses queue tuning: ``threshold`` reports of a key (0: never), with ``trials`` per job,
    at most ``jobs_per_chip_hour`` demand jobs per chip in any hour (0: none), within the sweeps'
    limits (``max_shape_bytes``, ``max_jobs_per_sweep``)."""

    threshold: int = 3
    trials: int = 40
    jobs_per_chip_hour: int = 20
    max_shape_bytes: int = jobs.DEFAULT_MAX_SHAPE_BYTES
    max_jobs_per_sweep: int = 10_000

    @property
    def demand_on(self) -> bool:
        """True when misses may queue jobs at all."""
        return self.threshold > 0 and self.jobs_per_chip_hour > 0


@dataclass
class _Tally:
    """One key's reports within a batch, summed."""

    spec: KernelSpec
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


def demand_backend(spec: KernelSpec) -> str:
    """The backend of a demand job: the portable ``torch`` if the kernel has it, else its first."""
    backends = spec.backends()
    return "torch" if "torch" in backends else backends[0]


class Misses:
    """Counts misses and queues demand jobs; see the module docstring for the contract."""

    def __init__(self, db: Database, policy: MissPolicy = MissPolicy()) -> None:
        self.db = db
        self.policy = policy
        # SQLite has one writer: this replica's reports and passes take turns for it (one thread
        # writes them), and waiting reports hold none of the server's threads.
        self._serial = not db.postgres
        self._writing = threading.Lock()
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tiletune-misses")
        self._last_write_end_s = -math.inf

    async def off_loop(self, work: Callable[[], T]) -> T:
        """``work()`` (a report) in a thread: on SQLite this replica's one misses thread (reports
        wait for it holding none of the server's threads), on PostgreSQL the server's pool."""
        if self._serial:
            return await asyncio.wrap_future(self._writer.submit(work))
        return await run_in_threadpool(work)

    def report(self, batch: MissesCreate) -> MissesPublic:
        """Count a batch of misses (checked whole first) and run a demand pass over its chips."""
        tallies = self._tally(batch.misses)
        keys = sorted(tallies)
        with self._turn():
            chip_ids = self._chip_ids({tally.chip for tally in tallies.values()})
            now = self.db.clock()
            for start in range(0, len(keys), REPORT_CHUNK_KEYS):
                with self._write() as session:
                    self._add(
                        session,
                        [tallies[key] for key in keys[start : start + REPORT_CHUNK_KEYS]],
                        chip_ids,
                        now,
                    )
            queued = self._pass(sorted(set(chip_ids.values())))
        return MissesPublic(
            accepted=len(batch.misses), queued_jobs=[job for key, job in queued if key in tallies]
        )

    def plan_demand(self, chip_ids: Collection[int] | None = None, wait: bool = True) -> list[int]:
        """A demand pass over ``chip_ids`` (every registered chip by default); the jobs it queued.

        With ``wait`` False it passes (nothing queued) while this replica writes a report on
        SQLite: that report runs a pass of its own, and the caller (the reaper) is not held up.
        """
        with self._turn(wait) as mine:
            return [job for _, job in self._pass(chip_ids)] if mine else []

    def misses(
        self, chip: str | None = None, kernel: str | None = None, limit: int = 100
    ) -> list[MissPublic]:
        """The keys of the kernels' current versions, highest count first; see the module docstring."""
        specs = [lookup_kernel(kernel)] if kernel is not None else list(all_kernels().values())
        query = select(MissRow).where(_current_versions(specs))
        if chip is not None:
            query = query.where(MissRow.chip_name == chip)
        query = query.order_by(MissRow.count.desc(), MissRow.last_seen_at.desc(), MissRow.id).limit(limit)
        with self.db.read() as session:
            return [_public(row) for row in session.scalars(query)]

    @contextmanager
    def _turn(self, wait: bool = True) -> Iterator[bool]:
        """This replica's turn to write misses on SQLite (``True`` once it has it; ``False`` if it
        would have to wait and ``wait`` is False); always at once on PostgreSQL (row locks)."""
        if not self._serial:
            yield True
            return
        if not self._writing.acquire(blocking=wait):
            yield False
            return
        try:
            yield True
        finally:
            self._writing.release()

    @contextmanager
    def _write(self) -> Iterator[Session]:
        """One write transaction of this replica's misses, on SQLite at least :data:`WRITER_YIELD_S`
        after the last one ended (callers hold ``_turn``)."""
        if self._serial:
            time.sleep(max(0.0, self._last_write_end_s + WRITER_YIELD_S - time.monotonic()))
        try:
            with self.db.write() as session:
                yield session
        finally:
            self._last_write_end_s = time.monotonic()

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

    # -- demand -----------------------------------------------------------------------------

    def _pass(self, chip_ids: Collection[int] | None) -> list[tuple[MissKey, int]]:
        """A demand pass (callers hold ``_turn``): per chip with budget left and an eligible key,
        queue the keys with the highest counts; ``(key, job id)`` of each job queued."""
        if not self.policy.demand_on:
            return []
        with self.db.read() as session:
            chips = list(chip_ids) if chip_ids is not None else list(session.scalars(select(ChipRow.id)))
            due = [
                chip_id
                for chip_id in chips
                if self._budget_left(session, chip_id, self.db.clock()) > 0
                and session.scalar(self._eligible(chip_id).with_only_columns(MissRow.id).limit(1)) is not None
            ]
        queued: list[tuple[MissKey, int]] = []
        for chip_id in due:
            queued.extend(self._pass_chip(chip_id))
        return queued

    def _pass_chip(self, chip_id: int) -> list[tuple[MissKey, int]]:
        """Queue ``chip_id``'s eligible keys, highest count first, until its budget or its keys run out."""
        queued: list[tuple[MissKey, int]] = []
        passed_over: list[int] = []  # keys this pass could not plan: not taken again
        chunk = min(PASS_CHUNK_JOBS, self.policy.max_jobs_per_sweep)
        while True:
            with self._write() as session:
                now = self.db.clock()
                # the chip's lock (PostgreSQL; SQLite's writer lock is held already): passes of
                # other replicas over this chip wait here, then count what this one queued
                session.execute(select(ChipRow.id).where(ChipRow.id == chip_id).with_for_update())
                left = min(chunk, self._budget_left(session, chip_id, now))
                if left <= 0:
                    return queued
                eligible = self._eligible(chip_id)
                if passed_over:
                    eligible = eligible.where(MissRow.id.not_in(passed_over))
                rows = session.scalars(
                    eligible.limit(left).with_for_update(skip_locked=True, of=MissRow)
                ).all()
                if not rows:
                    return queued
                for row in rows:
                    job = self._queue(session, row, now)
                    if job is None:
                        passed_over.append(row.id)
                    elif job.state == JobState.QUEUED:
                        queued.append((_key_of(row), job.id))

    def _budget_left(self, session: Session, chip_id: int, now: datetime) -> int:
        """Demand jobs ``chip_id`` may still have queued in the hour before ``now``."""
        used = session.scalar(
            select(func.count())
            .select_from(MissRow)
            .where(MissRow.chip_id == chip_id, MissRow.demand_queued_at > now - DEMAND_WINDOW)
        )
        return self.policy.jobs_per_chip_hour - (used or 0)

    def _eligible(self, chip_id: int) -> Select[MissRow]:
        """``chip_id``'s keys that demand may queue (see the module docstring), highest count first."""
        current = _current_versions(all_kernels().values())
        tuned = (
            select(BestConfigRow.id)
            .where(*_same_key(BestConfigRow), BestConfigRow.chip_id == MissRow.chip_id)
            .exists()
        )
        live = (
            select(JobRow.id)
            .where(
                *_same_key(JobRow),
                JobRow.state.in_(LIVE_JOB_STATES),
                or_(JobRow.chip_id == MissRow.chip_id, JobRow.chip_target == MissRow.chip_name),
            )
            .exists()
        )
        return (
            select(MissRow)
            .where(
                MissRow.chip_id == chip_id,
                MissRow.count >= self.policy.threshold,
                MissRow.job_id.is_(None),
                MissRow.demand_queued_at.is_(None),
                current,
                or_(MissRow.bench_bytes.is_(None), MissRow.bench_bytes <= self.policy.max_shape_bytes),
                ~tuned,
                ~live,
            )
            .order_by(MissRow.count.desc(), MissRow.last_seen_at.desc(), MissRow.id)
        )

    def _queue(self, session: Session, row: MissRow, now: datetime) -> JobPublic | None:
        """A demand job for ``row``'s key (its id and time kept on the key), or ``None`` when the
        sweeps' rules refuse it (a key counted before its bench size was kept, over the limit)."""
        spec = lookup_kernel(row.kernel)
        try:
            request = SweepCreate(
                name=DEMAND_SWEEP,
                kernel=row.kernel,
                shapes=[row.shape],
                dtypes=[row.dtype],
                chips=[row.chip_name],
                trials=self.policy.trials,
                backend=demand_backend(spec),
            )
            planned = jobs.plan_sweep(request, self.policy.max_jobs_per_sweep, self.policy.max_shape_bytes)
        except (InvalidInputError, ValidationError) as error:
            log.info("demand passes over %s %s %s: %s", row.kernel, row.shape_key, row.dtype, error)
            return None
        job = jobs.create_sweep(session, request, planned, now).jobs[0]
        row.job_id = job.id
        row.demand_queued_at = now
        return job

    @staticmethod
    def _live_job(session: Session, row: MissRow, chip_id: int | None) -> bool:
        """True when a job of ``row``'s key is queued, running or validating on its chip."""
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


@dataclass(frozen=True)
class SelectedQueued:
    """What :func:`queue_selected` did: the sweep (``None`` when nothing was left to queue),
    each queued key's ``(miss id, job id, job state)``, and the misses it left alone."""

    sweep_id: int | None
    jobs: list[tuple[int, int, str]]
    live: list[int]
    stale: list[int]


def queue_selected(
    session: Session,
    miss_ids: list[int],
    *,
    trials: int,
    now: datetime,
    owner_token_id: int | None,
    max_jobs: int,
    max_shape_bytes: int = jobs.DEFAULT_MAX_SHAPE_BYTES,
) -> SelectedQueued:
    """Queue one sweep (``misses``, of token ``owner_token_id``) tuning the misses ``miss_ids``.

    One job per miss (its kernel, shape, dtype and ``chips=[its chip]``, ``trials``, the
    kernel's :func:`demand_backend`), planned and born by the sweeps' rules (a key already
    tuned on its chip's newest software is born ``skipped``). Left alone: misses of a kernel
    version that is no longer the registry's (``stale``: a kernel no longer registered too) and
    misses whose key has a live job on its chip (``live``). A queued job's id is kept on its
    miss. Runs in the caller's (write) transaction; an unknown id is an
    :class:`InvalidInputError` naming ``miss``, and so is a choice one sweep cannot hold (over
    ``max_jobs`` jobs, 64 kernels or 64 chips).
    """
    ids = list(dict.fromkeys(miss_ids))
    # locked in id order (PostgreSQL): a concurrent choice of the same misses waits, then sees the job
    chosen_rows = select(MissRow).where(MissRow.id.in_(ids)).order_by(MissRow.id).with_for_update()
    rows = {row.id: row for row in session.scalars(chosen_rows)}
    unknown = [miss_id for miss_id in ids if miss_id not in rows]
    if unknown:
        raise InvalidInputError(f"no miss {unknown[0]}", field="miss")
    if len(ids) > max_jobs:
        raise InvalidInputError(f"{len(ids)} misses make {len(ids)} jobs; at most {max_jobs}", "miss")
    chosen: list[tuple[MissRow, jobs.PlannedJob]] = []
    live: list[int] = []
    stale: list[int] = []
    for miss_id in ids:
        row = rows[miss_id]
        spec = all_kernels().get(row.kernel)
        if spec is None or row.kernel_version != spec.version:
            stale.append(miss_id)
            continue
        chip = chip_by_name(session, row.chip_name)
        if Misses._live_job(session, row, chip.id if chip is not None else row.chip_id):
            live.append(miss_id)
            continue
        single = SweepCreate(
            kernel=row.kernel,
            shapes=[row.shape],
            dtypes=[row.dtype],
            chips=[row.chip_name],
            trials=trials,
            backend=demand_backend(spec),
        )
        chosen.append((row, jobs.plan_sweep(single, 1, max_shape_bytes)[0]))
    if not chosen:
        return SelectedQueued(None, [], live, stale)
    request = _selected_request([planned for _, planned in chosen], trials)
    created = jobs.create_sweep(session, request, [planned for _, planned in chosen], now, owner_token_id)
    queued = []
    for (row, planned), job in zip(chosen, created.jobs, strict=True):
        backend = demand_backend(planned.spec)
        if job.backend != backend:  # a selection of kernels whose demand backends differ
            session.get_one(JobRow, job.id).backend = backend
        if job.state == JobState.QUEUED:
            row.job_id = job.id
        queued.append((row.id, job.id, str(job.state)))
    return SelectedQueued(created.id, queued, live, stale)


def _selected_request(planned: list[jobs.PlannedJob], trials: int) -> SweepCreate:
    """The sweep request kept for reference with a sweep of chosen misses: its kernels, shapes,
    dtypes and chips (the jobs are the chosen keys, not their product) and the common backend."""
    shapes: dict[str, list[Shape]] = {}
    for job in planned:
        found = shapes.setdefault(job.spec.name, [])
        if job.shape not in found:
            found.append(job.shape)
    backends = {demand_backend(job.spec) for job in planned}
    try:
        return SweepCreate(
            name=SELECTED_SWEEP,
            kernels=[SweepKernel(kernel=name, shapes=listed) for name, listed in shapes.items()],
            dtypes=list(dict.fromkeys(job.dtype for job in planned)),
            chips=list(dict.fromkeys(job.chip_target for job in planned)),
            trials=trials,
            backend=backends.pop() if len(backends) == 1 else None,
        )
    except ValidationError as error:
        raise InvalidInputError(
            f"one sweep cannot hold these misses ({error.errors()[0]['msg']}); choose fewer", field="miss"
        ) from None


def _key_of(row: MissRow) -> MissKey:
    return (row.kernel, row.kernel_version, row.shape_key, row.dtype, row.chip_name)


def _current_versions(specs: Iterable[KernelSpec]) -> ColumnElement[bool]:
    """Misses of ``specs`` at their registered versions."""
    return or_(*(and_(MissRow.kernel == s.name, MissRow.kernel_version == s.version) for s in specs))


def _same_key(table: type[BestConfigRow] | type[JobRow]) -> tuple[ColumnElement[bool], ...]:
    """``table``'s kernel, version, shape and dtype equal to the miss row's (a correlated subquery's)."""
    return (
        table.kernel == MissRow.kernel,
        table.kernel_version == MissRow.kernel_version,
        table.shape_key == MissRow.shape_key,
        table.dtype == MissRow.dtype,
    )


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
