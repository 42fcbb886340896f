"""The store: chips, workers, sweeps, jobs and best configs in SQL (SQLite or PostgreSQL).

Contract (one suite of tests runs it on both databases):

- every method runs in its own transaction and either changes everything it
  says or nothing; bad input raises :class:`~tiletune.service.errors.InvalidInputError`
  naming the field, before anything is written;
- ``register_worker`` creates or updates the chip (limits) and records the
  software fingerprint beside it;
- ``submit`` validates every (shape, dtype) against the kernel's spec and
  creates one ``queued`` job per (shape, dtype, chip target); a key already
  tuned on that chip with the same kernel version and software is created
  ``skipped`` unless ``force``; ``submit_in`` does the same inside a caller's
  transaction (demand-driven tuning, :mod:`tiletune.service.misses`);
- ``promote`` replaces a key's best config and appends to its history;
- time comes from the injected ``clock``.

Leasing lives in :mod:`tiletune.service.queue`; the search in
:mod:`tiletune.service.studies`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from tiletune.client.nearest import nearest
from tiletune.client.wire import (
    ANY_CHIP,
    BestConfigPublic,
    ChipWire,
    HistoryPoint,
    JobProgress,
    JobPublic,
    SweepCreate,
    SweepPublic,
    TrialPublic,
    WorkerCreate,
)
from tiletune.kernels import DeviceLimits, KernelSpec, Shape, get_kernel
from tiletune.kernels.errors import InputError
from tiletune.kernels.spec import DTYPES
from tiletune.service.errors import InvalidInputError, NotFoundError
from tiletune.service.models import (
    BestConfigRow,
    ChipRow,
    JobRow,
    PromotionRow,
    SoftwareRow,
    SweepRow,
    TrialRow,
    WorkerRow,
)

Clock = Callable[[], datetime]

#: Job states in which a job still has work to do.
LIVE_STATES = ("queued", "running", "validating")


def utc_now() -> datetime:
    """The wall clock, timezone-aware UTC."""
    return datetime.now(UTC)


def fingerprint_text(software: dict[str, str | None]) -> str:
    """A software fingerprint as canonical JSON (equal text means equal software)."""
    return json.dumps(software, sort_keys=True, separators=(",", ":"))


def aware(moment: datetime) -> datetime:
    """``moment`` as timezone-aware UTC (SQLite hands back naive datetimes)."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def chip_limits(chip: ChipRow) -> DeviceLimits:
    """The constraint limits a chip registered (its kind too: some constraints differ on NPUs)."""
    return DeviceLimits(chip.local_memory_bytes, chip.max_buffer_num, chip.alignment_bytes, kind=chip.kind)


def lookup_kernel(name: str, field: str = "kernel") -> KernelSpec:
    """The registered kernel ``name``; :class:`InvalidInputError` naming ``field`` otherwise."""
    try:
        return get_kernel(name)
    except InputError as error:
        raise InvalidInputError(error.reason, field=field) from error


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


@dataclass(frozen=True)
class JobKey:
    """What identifies a job's result: kernel, version, canonical shape, dtype, chip."""

    kernel: str
    kernel_version: int
    shape_key: str
    dtype: str
    chip_id: int


class Store:
    """Sweeps, jobs, workers and best configs; see the module docstring for the contract."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        clock: Clock = utc_now,
        reads: sessionmaker[Session] | None = None,
    ) -> None:
        """``sessions`` for writes (``sessions.begin()``), ``reads`` for read-only work (default: same)."""
        self.sessions = sessions
        self.reads = reads or sessions
        self.clock = clock
        #: Moves on every promotion or import in this process: caches of best configs compare it.
        self.generation = 0

    # -- chips and workers ------------------------------------------------------------------

    def register_worker(self, request: WorkerCreate) -> tuple[WorkerRow, ChipRow]:
        """Record a worker, its chip (limits updated) and its software fingerprint.

        Workers of a new chip registering at once race to create it; the loser tries again.
        """
        for index, backend in enumerate(request.backends):
            if not backend:
                raise InvalidInputError("backend names must not be empty", field=f"backends[{index}]")
        try:
            return self._register_worker(request)
        except IntegrityError:
            return self._register_worker(request)

    def _register_worker(self, request: WorkerCreate) -> tuple[WorkerRow, ChipRow]:
        now = self.clock()
        with self.sessions.begin() as session:
            chip = self._upsert_chip(session, request.chip, now)
            software = self._software(session, chip.id, request.software, now)
            worker = WorkerRow(
                name=request.name,
                chip_id=chip.id,
                software_id=software.id,
                backends=list(request.backends),
                kernels=list(request.kernels),
                kernel_versions=dict(request.kernel_versions),
                registered_at=now,
                last_seen_at=now,
            )
            session.add(worker)
            session.flush()
            return worker, chip

    def _upsert_chip(self, session: Session, wire: ChipWire, now: datetime) -> ChipRow:
        chip = session.scalar(select(ChipRow).where(ChipRow.name == wire.name))
        if chip is None:
            chip = ChipRow(name=wire.name, created_at=now)
            session.add(chip)
        chip.kind = wire.kind
        chip.local_memory_bytes = wire.local_memory_bytes
        chip.max_buffer_num = wire.max_buffer_num
        chip.alignment_bytes = wire.alignment_bytes
        chip.updated_at = now
        session.flush()
        return chip

    @staticmethod
    def _software(
        session: Session, chip_id: int, software: dict[str, str | None], now: datetime
    ) -> SoftwareRow:
        text = fingerprint_text(software)
        row = session.scalar(
            select(SoftwareRow).where(SoftwareRow.chip_id == chip_id, SoftwareRow.fingerprint == text)
        )
        if row is None:
            row = SoftwareRow(chip_id=chip_id, fingerprint=text, first_seen_at=now)
            session.add(row)
            session.flush()
        return row

    def worker(self, session: Session, worker_id: int) -> WorkerRow:
        """The worker ``worker_id`` (marked seen now); :class:`NotFoundError` otherwise."""
        worker = session.get(WorkerRow, worker_id)
        if worker is None:
            raise NotFoundError(f"no worker {worker_id}; register first", field="worker_id")
        worker.last_seen_at = self.clock()
        return worker

    def chip_by_name(self, session: Session, name: str) -> ChipRow | None:
        """The chip registered under ``name``, if any."""
        return session.scalar(select(ChipRow).where(ChipRow.name == name))

    # -- sweeps and jobs --------------------------------------------------------------------

    def submit(self, request: SweepCreate, max_jobs: int = 10_000) -> SweepPublic:
        """Validate a sweep and create its jobs; see the module docstring."""
        keys = self._sweep_keys(request, max_jobs)
        with self.sessions.begin() as session:
            return self._create_sweep(session, request, keys)

    def submit_in(self, session: Session, request: SweepCreate, max_jobs: int = 10_000) -> SweepPublic:
        """:meth:`submit` inside the caller's transaction ``session`` (same rules, same skips)."""
        return self._create_sweep(session, request, self._sweep_keys(request, max_jobs))

    def _sweep_keys(self, request: SweepCreate, max_jobs: int) -> list[tuple[KernelSpec, Shape, str, str]]:
        """Every (spec, shape, dtype, chip target) of a valid sweep; errors name the field."""
        work = self._parse_parts(request)
        for index, dtype in enumerate(request.dtypes):
            if dtype not in DTYPES:
                choices = list(DTYPES)
                raise InvalidInputError(
                    f"unknown dtype {dtype!r}; choose one of {choices}", f"dtypes[{index}]"
                )
        for spec, _ in work:
            if request.backend is not None and request.backend not in spec.backends():
                raise InvalidInputError(
                    f"kernel {spec.name} has no backend {request.backend!r}; "
                    f"choose one of {list(spec.backends())}",
                    field="backend",
                )
        chips = list(dict.fromkeys(request.chips)) or [ANY_CHIP]
        dtypes = list(dict.fromkeys(request.dtypes))
        keys = [(spec, s, d, c) for spec, shapes in work for s in shapes for d in dtypes for c in chips]
        if len(keys) > max_jobs:
            raise InvalidInputError(
                f"the sweep makes {len(keys)} jobs; at most {max_jobs} are allowed", "shapes"
            )
        return keys

    def _create_sweep(
        self, session: Session, request: SweepCreate, keys: Sequence[tuple[KernelSpec, Shape, str, str]]
    ) -> SweepPublic:
        now = self.clock()
        kernels = list(dict.fromkeys(spec.name for spec, _, _, _ in keys))
        sweep = SweepRow(
            name=request.name, kernels=kernels, request=request.model_dump(mode="json"), created_at=now
        )
        session.add(sweep)
        session.flush()
        for spec, shape, dtype, chip in keys:
            job = self._new_job(
                session,
                sweep_id=sweep.id,
                spec=spec,
                shape=shape,
                dtype=dtype,
                chip_target=chip,
                request=request,
                now=now,
            )
            session.add(job)
        session.flush()
        return self._sweep_public(session, sweep)

    @classmethod
    def _parse_parts(cls, request: SweepCreate) -> list[tuple[KernelSpec, list[dict[str, int]]]]:
        """Each kernel of the sweep with its parsed, de-duplicated shapes; errors name the field."""
        parts = []
        for position, part in enumerate(request.parts()):
            where = "" if request.kernel and position == 0 else f"kernels[{position - bool(request.kernel)}]."
            spec = lookup_kernel(part.kernel, field=f"{where}kernel")
            parts.append((spec, cls._parse_shapes(spec, part.shapes, f"{where}shapes")))
        return parts

    @staticmethod
    def _parse_shapes(spec: KernelSpec, raw: Sequence[dict[str, int]], field: str) -> list[dict[str, int]]:
        shapes = []
        for index, shape in enumerate(raw):
            try:
                shapes.append(spec.parse_shape(shape))
            except InputError as error:
                path = error.field.replace("shape", f"{field}[{index}]", 1)  # shape.n -> shapes[0].n
                raise InvalidInputError(error.reason, field=path) from error
        return list({spec.canonical_shape(s): s for s in shapes}.values())

    def _new_job(
        self,
        session: Session,
        *,
        sweep_id: int,
        spec: KernelSpec,
        shape: dict[str, int],
        dtype: str,
        chip_target: str,
        request: SweepCreate,
        now: datetime,
    ) -> JobRow:
        chip = self.chip_by_name(session, chip_target) if chip_target != ANY_CHIP else None
        shape_key = spec.canonical_shape(shape)
        state = "queued"
        if chip is not None and not request.force:
            key = JobKey(spec.name, spec.version, shape_key, dtype, chip.id)
            if self._tuned_on_current_software(session, key):
                state = "skipped"
        return JobRow(
            sweep_id=sweep_id,
            kernel=spec.name,
            kernel_version=spec.version,
            shape=shape,
            shape_key=shape_key,
            dtype=dtype,
            chip_target=chip_target,
            chip_id=chip.id if chip is not None else None,
            backend=request.backend or spec.backends()[0],
            strategy=request.strategy,
            trials=request.trials,
            max_time_s=request.max_time_s,
            patience=request.patience,
            seed=request.seed,
            workers_per_job=request.workers_per_job,
            validate_top=request.validate_top,
            force=request.force,
            state=state,
            active_leases=0,
            lease_failures=0,
            failure_reasons=[],
            created_at=now,
            updated_at=now,
            finished_at=now if state == "skipped" else None,
        )

    @staticmethod
    def _tuned_on_current_software(session: Session, key: JobKey) -> bool:
        """True when ``key`` has a best config measured with the chip's newest software."""
        best = Store.best_row(session, key)
        if best is None:
            return False
        newest = session.scalar(
            select(SoftwareRow.id)
            .where(SoftwareRow.chip_id == key.chip_id)
            .order_by(SoftwareRow.first_seen_at.desc(), SoftwareRow.id.desc())
            .limit(1)
        )
        return best.software_id == newest

    def tuned_on_software(self, session: Session, key: JobKey, software_id: int) -> bool:
        """True when ``key`` already has a best config measured with ``software_id``."""
        best = self.best_row(session, key)
        return best is not None and best.software_id == software_id

    def sweep(self, sweep_id: int) -> SweepPublic:
        """One sweep with its jobs."""
        with self.reads() as session:
            sweep = session.get(SweepRow, sweep_id)
            if sweep is None:
                raise NotFoundError(f"no sweep {sweep_id}", field="sweep_id")
            return self._sweep_public(session, sweep)

    def sweeps(self, limit: int = 50, offset: int = 0) -> list[SweepPublic]:
        """The newest sweeps first."""
        with self.reads() as session:
            rows = session.scalars(select(SweepRow).order_by(SweepRow.id.desc()).limit(limit).offset(offset))
            return [self._sweep_public(session, sweep) for sweep in rows]

    def job(self, job_id: int) -> JobPublic:
        """One job with its progress."""
        with self.reads() as session:
            return self.job_public(session, self.job_row(session, job_id))

    def jobs(self, state: str | None = None, limit: int = 100, offset: int = 0) -> list[JobPublic]:
        """Jobs, newest first, optionally in one state."""
        with self.reads() as session:
            query = select(JobRow).order_by(JobRow.id.desc()).limit(limit).offset(offset)
            if state is not None:
                query = query.where(JobRow.state == state)
            return [self.job_public(session, job) for job in session.scalars(query)]

    @staticmethod
    def job_row(session: Session, job_id: int) -> JobRow:
        """The job ``job_id``; :class:`NotFoundError` otherwise."""
        job = session.get(JobRow, job_id)
        if job is None:
            raise NotFoundError(f"no job {job_id}", field="job_id")
        return job

    def _sweep_public(self, session: Session, sweep: SweepRow) -> SweepPublic:
        jobs = session.scalars(select(JobRow).where(JobRow.sweep_id == sweep.id).order_by(JobRow.id)).all()
        counts: dict[str, int] = {}
        for job in jobs:
            counts[job.state] = counts.get(job.state, 0) + 1
        live = any(job.state in LIVE_STATES for job in jobs)
        return SweepPublic(
            id=sweep.id,
            name=sweep.name,
            kernels=list(sweep.kernels),
            state="running" if live else "finished",
            created_at=aware(sweep.created_at),
            counts=counts,
            jobs=[self.job_public(session, job) for job in jobs],
        )

    @staticmethod
    def job_public(session: Session, job: JobRow) -> JobPublic:
        """A job row as the API shows it."""
        chip = session.get(ChipRow, job.chip_id) if job.chip_id is not None else None
        speedup = job.default_ms / job.best_ms if job.default_ms and job.best_ms else None
        return JobPublic(
            id=job.id,
            sweep_id=job.sweep_id,
            kernel=job.kernel,
            kernel_version=job.kernel_version,
            shape=job.shape,
            shape_key=job.shape_key,
            dtype=job.dtype,
            chip=chip.name if chip is not None else job.chip_target,
            backend=job.backend,
            strategy=job.strategy,
            trials=job.trials,
            max_time_s=job.max_time_s,
            patience=job.patience,
            state=job.state,
            lease_failures=job.lease_failures,
            failure_reasons=list(job.failure_reasons),
            progress=JobProgress(
                completed=job.completed,
                invalid=job.invalid,
                failed=job.failed,
                best_ms=job.best_ms,
                best_config=job.best_config,
                default_ms=job.default_ms,
                speedup_vs_default=speedup,
            ),
            created_at=aware(job.created_at),
            updated_at=aware(job.updated_at),
        )

    # -- best configs -----------------------------------------------------------------------

    @staticmethod
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

    def promote(self, session: Session, key: JobKey, winner: Winner) -> BestConfigRow:
        """Make ``winner`` the best config of ``key`` (in ``session``) and append it to the history."""
        now = self.clock()
        self.generation += 1
        best = self.best_row(session, key)
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
        session.flush()
        return best

    def best_public(self, session: Session, best: BestConfigRow) -> BestConfigPublic:
        """A best-config row as the API shows it, with its provenance."""
        chip = session.get(ChipRow, best.chip_id)
        software = session.get(SoftwareRow, best.software_id) if best.software_id is not None else None
        fingerprint = json.loads(software.fingerprint) if software is not None else {}
        return _best_public(best, chip.name if chip is not None else "", fingerprint)

    def exact_public(
        self, session: Session, spec: KernelSpec, shape_key: str, dtype: str, chip: str
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
        return _best_public(best, chip, json.loads(text) if text else {})

    def best_configs(self, chip: str, kernel: str | None = None) -> list[BestConfigPublic]:
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
        with self.reads() as session:
            for best, text in session.execute(query.order_by(BestConfigRow.kernel, BestConfigRow.shape_key)):
                if text not in fingerprints:
                    fingerprints[text] = json.loads(text)
                entries.append(_best_public(best, chip, fingerprints[text]))
        return entries

    def nearest_best(
        self,
        session: Session,
        spec: KernelSpec,
        shape: dict[str, int],
        *,
        dtype: str,
        chip_id: int,
        k: int = 1,
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

    def import_configs(self, configs: Sequence[BestConfigPublic]) -> int:
        """Store a bundle of exported best configs (chips must be known); returns how many changed.

        An entry replaces a key's best only when the key has none or the entry
        is faster; it is recorded in the key's history like a promotion (no job).
        """
        changed = 0
        with self.sessions.begin() as session:
            for index, entry in enumerate(configs):
                chip = self.chip_by_name(session, entry.chip)
                if chip is None:
                    raise InvalidInputError(
                        f"unknown chip {entry.chip!r}: register a worker first", f"configs[{index}].chip"
                    )
                key = JobKey(entry.kernel, entry.kernel_version, entry.shape_key, entry.dtype, chip.id)
                best = self.best_row(session, key)
                if best is not None and best.median_ms <= entry.median_ms:
                    continue
                software = self._software(session, chip.id, entry.software, self.clock())
                winner = Winner(
                    shape=entry.shape,
                    config=entry.config,
                    median_ms=entry.median_ms,
                    default_config=entry.default_config,
                    default_ms=entry.default_ms,
                    software_id=software.id,
                )
                self.promote(session, key, winner)
                changed += 1
        return changed

    def history(self, kernel: str, shape_key: str, dtype: str, chip: str | None = None) -> list[HistoryPoint]:
        """Every promotion of a shape's best config, oldest first (across versions, software, chips)."""
        with self.reads() as session:
            query = select(PromotionRow, ChipRow.name).join(ChipRow, ChipRow.id == PromotionRow.chip_id)
            query = query.where(PromotionRow.kernel == kernel)
            query = query.where(PromotionRow.shape_key == shape_key, PromotionRow.dtype == dtype)
            if chip is not None:
                query = query.where(ChipRow.name == chip)
            points = []
            for row, chip_name in session.execute(query.order_by(PromotionRow.promoted_at, PromotionRow.id)):
                software = session.get(SoftwareRow, row.software_id) if row.software_id is not None else None
                points.append(
                    HistoryPoint(
                        promoted_at=aware(row.promoted_at),
                        config=row.config,
                        median_ms=row.median_ms,
                        default_ms=row.default_ms,
                        kernel_version=row.kernel_version,
                        chip=chip_name,
                        software=json.loads(software.fingerprint) if software is not None else {},
                        job_id=row.job_id,
                    )
                )
            return points

    def counts(self) -> dict[str, Any]:
        """Jobs by state and the number of best configs (for /metrics and the dashboard)."""
        with self.reads() as session:
            by_state = dict(session.execute(select(JobRow.state, func.count()).group_by(JobRow.state)).all())
            best = session.scalar(select(func.count()).select_from(BestConfigRow)) or 0
            return {"jobs": {str(k): int(v) for k, v in by_state.items()}, "best_configs": int(best)}

    def trials(self, job_id: int) -> list[TrialPublic]:
        """Every trial of a job, in the order asked (validation runs last)."""
        with self.reads() as session:
            self.job_row(session, job_id)
            rows = session.scalars(select(TrialRow).where(TrialRow.job_id == job_id).order_by(TrialRow.id))
            return [
                TrialPublic(
                    id=row.id,
                    number=row.number,
                    phase=row.phase,
                    config=row.config,
                    state=row.state,
                    median_ms=row.median_ms,
                    p10_ms=row.p10_ms,
                    p90_ms=row.p90_ms,
                    samples=row.samples,
                    reason=row.reason,
                    asked_at=aware(row.asked_at),
                    told_at=aware(row.told_at) if row.told_at is not None else None,
                )
                for row in rows
            ]


def _best_public(best: BestConfigRow, chip: str, software: dict[str, str | None]) -> BestConfigPublic:
    """A best-config row with its chip's name and software fingerprint, as the API shows it."""
    return BestConfigPublic(
        kernel=best.kernel,
        kernel_version=best.kernel_version,
        shape=best.shape,
        shape_key=best.shape_key,
        dtype=best.dtype,
        chip=chip,
        config=best.config,
        median_ms=best.median_ms,
        default_config=best.default_config,
        default_ms=best.default_ms,
        speedup_vs_default=best.default_ms / best.median_ms if best.default_ms else None,
        job_id=best.job_id,
        trial_id=best.trial_id,
        software=software,
        promoted_at=aware(best.promoted_at),
    )
