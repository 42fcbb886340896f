"""Misses and demand-driven tuning: the keys clients asked for that nobody tuned.

A client whose lookup answered ``nearest`` or ``default`` reports the key
(off the launch path, in batches); enough reports of one key queue a job
that tunes it.

Contract (one suite of tests runs it on SQLite and PostgreSQL):

- ``report(batch)`` checks every entry before writing anything: the kernel
  is registered, the shape is complete and valid for its spec, the dtype is
  known. A bad entry raises :class:`~tiletune.service.errors.InvalidInputError`
  naming it (``misses[2].shape.n``) and the batch changes nothing.
- A key is (kernel, the registry's version of it, canonical shape, dtype,
  chip name). Each entry adds its ``count`` to its key: a batch is a count,
  so sending one twice counts twice (no idempotency). The key keeps the last
  report's ``match`` and its first and last report times (the database's
  clock). A batch is one transaction; ``accepted`` is its number of entries.
- Misses on a chip no worker registered are counted (``chip_id`` NULL) but
  queue nothing: a chip's limits come only from its workers. The first
  report after the chip registered links the key to it.
- Policy (``threshold`` 0 disables it): a key is queued when its count is at
  least ``threshold``, its chip is registered, it has no best config on that
  chip for the kernel's current version, no job of the key is live
  (``queued``, ``running``, ``validating``) on that chip, and demand never
  queued a job for it before. The job comes from a sweep named ``demand``
  (that shape and dtype, ``chips=[chip]``, ``trials``, backend ``torch`` or
  else the kernel's first), made by the sweeps' rules (:mod:`tiletune.service.jobs`) in the same
  transaction; its id is kept on the key and returned in ``queued_jobs``. At
  most one demand job per key: one that failed or was cancelled is for a
  person to look at and submit again.
- ``misses(chip, kernel, limit)`` lists the keys of the kernels' current
  versions, highest count first (then the most recently reported).
- :func:`queue_selected` (a person's choice, the dashboard's misses page) queues
  one sweep named ``misses`` with one job per chosen key, whatever the policy,
  skipping keys of an old kernel version and keys with a live job on their chip;
  each queued job's id is kept on its key (replacing an earlier, finished one).

Concurrency: counts are added by an upsert (``INSERT … ON CONFLICT DO
UPDATE SET count = count + n``), one key at a time in sorted order, so
concurrent batches neither lose counts nor deadlock. On PostgreSQL the
upsert locks the key's row until the batch commits, and on SQLite a write
transaction holds the database, so two batches crossing the threshold at
once queue one job.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError
from sqlalchemy import and_, func, or_, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from tiletune.client.wire import (
    LIVE_JOB_STATES,
    JobState,
    MissesCreate,
    MissesPublic,
    MissPublic,
    MissReport,
    SweepCreate,
    SweepKernel,
)
from tiletune.kernels import KernelSpec, Shape, all_kernels
from tiletune.service import configs, jobs
from tiletune.service.configs import JobKey
from tiletune.service.database import Database, aware
from tiletune.service.errors import InvalidInputError
from tiletune.service.fleet import chip_by_name
from tiletune.service.models import JobRow, MissRow
from tiletune.service.specs import check_dtype, lookup_kernel, parse_shape

#: The name of the sweeps demand creates.
DEMAND_SWEEP = "demand"
#: The name of the sweeps a person queues from chosen misses (:func:`queue_selected`).
SELECTED_SWEEP = "misses"

#: The columns that identify a miss (its unique constraint).
KEY_COLUMNS = ("kernel", "kernel_version", "shape_key", "dtype", "chip_name")

MissKey = tuple[str, int, str, str, str]


@dataclass(frozen=True)
class MissPolicy:
    """When misses queue tuning: ``threshold`` reports of a key (0: never), with ``trials`` per job."""

    threshold: int = 3
    trials: int = 40


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

    def report(self, batch: MissesCreate) -> MissesPublic:
        """Count a batch of misses and queue the keys the policy picks; all or nothing."""
        tallies = self._tally(batch.misses)
        now = self.db.clock()
        queued = []
        with self.db.write() as session:
            for key in sorted(tallies):
                row = self._add(session, tallies[key], now)
                job_id = self._maybe_queue(session, row)
                if job_id is not None:
                    queued.append(job_id)
        return MissesPublic(accepted=len(batch.misses), queued_jobs=queued)

    def misses(
        self, chip: str | None = None, kernel: str | None = None, limit: int = 100
    ) -> list[MissPublic]:
        """The keys of the kernels' current versions, highest count first; see the module docstring."""
        specs = [lookup_kernel(kernel)] if kernel is not None else list(all_kernels().values())
        current = or_(*(and_(MissRow.kernel == s.name, MissRow.kernel_version == s.version) for s in specs))
        query = select(MissRow).where(current)
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
            tally = _Tally(
                spec, shape, spec.canonical_shape(shape), entry.dtype, entry.chip, entry.count, entry.match
            )
            found = tallies.setdefault(tally.key, tally)
            if found is not tally:
                found.count += tally.count
                found.match = tally.match
        return tallies

    def _add(self, session: Session, tally: _Tally, now: datetime) -> MissRow:
        """Add ``tally`` to its key's row (created if new) by an upsert; the row as it is now."""
        chip = chip_by_name(session, tally.chip)
        values: dict[str, Any] = {
            "kernel": tally.spec.name,
            "kernel_version": tally.spec.version,
            "shape": tally.shape,
            "shape_key": tally.shape_key,
            "dtype": tally.dtype,
            "chip_name": tally.chip,
            "chip_id": chip.id if chip is not None else None,
            "count": tally.count,
            "last_match": tally.match,
            "first_seen_at": now,
            "last_seen_at": now,
        }
        dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
        insert = dialect.insert(MissRow).values(values)
        excluded = insert.excluded
        session.execute(
            insert.on_conflict_do_update(
                index_elements=list(KEY_COLUMNS),
                set_={
                    "count": MissRow.count + excluded.count,
                    "last_match": excluded.last_match,
                    "last_seen_at": excluded.last_seen_at,
                    "chip_id": func.coalesce(excluded.chip_id, MissRow.chip_id),
                },
            )
        )
        name, version, shape_key, dtype, chip_name = tally.key
        return session.scalars(
            select(MissRow)
            .where(
                MissRow.kernel == name,
                MissRow.kernel_version == version,
                MissRow.shape_key == shape_key,
                MissRow.dtype == dtype,
                MissRow.chip_name == chip_name,
            )
            .execution_options(populate_existing=True)
        ).one()

    # -- policy -----------------------------------------------------------------------------

    def _maybe_queue(self, session: Session, row: MissRow) -> int | None:
        """Queue a demand job for ``row``'s key if the policy says so; its id, else ``None``."""
        threshold = self.policy.threshold
        if threshold <= 0 or row.count < threshold or row.chip_id is None or row.job_id is not None:
            return None
        key = JobKey(row.kernel, row.kernel_version, row.shape_key, row.dtype, row.chip_id)
        if configs.best_row(session, key) is not None or self._live_job(session, row, row.chip_id):
            return None
        spec = lookup_kernel(row.kernel)
        request = SweepCreate(
            name=DEMAND_SWEEP,
            kernel=row.kernel,
            shapes=[row.shape],
            dtypes=[row.dtype],
            chips=[row.chip_name],
            trials=self.policy.trials,
            backend=demand_backend(spec),
        )
        job = jobs.create_sweep(session, request, jobs.plan_sweep(request, max_jobs=1), self.db.clock()).jobs[
            0
        ]
        if job.state != JobState.QUEUED:
            return None
        row.job_id = job.id
        return job.id

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
