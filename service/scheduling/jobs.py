"""Sweeps and jobs: a sweep planned from its request, its jobs created, rows found. A repository.

Functions take the caller's session and never commit (see :mod:`tiletune.service.database`).

- :func:`plan_sweep` validates a request against the kernels' specs before anything is
  written (errors name the field: ``kernels[1].shapes[0].n``, ``dtypes[2]``) and lists its
  keys, one per (kernel, shape, dtype, chip target), shapes de-duplicated;
- :func:`create_sweep` writes the sweep and one job per key, born as the lifecycle says:
  ``skipped`` when the key is already tuned on that chip with the same kernel version and
  the chip's newest software (unless ``force``) or another live job tunes it (one live job per
  key, held by the database's partial unique index ``uq_jobs_live_key``), else ``queued``; with an
  idempotency key, a repeated request answers its first sweep.

A sweep's ``backend`` must be one its kernels declare (their ``implementations``: what they have
on any machine, never what the server's own machine builds); its jobs keep it.
A sweep that names none makes jobs with no backend (``NULL``): each runs the implementation its
first lease's worker prefers (:mod:`tiletune.service.scheduling.queue`). Whether a worker can run a named
backend is the lease's business.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, defer

from tiletune.client.wire import ANY_CHIP, LIVE_JOB_STATES, JobState, Role, SweepCreate, SweepPublic
from tiletune.kernels import KernelDeclaration, Shape
from tiletune.kernels.declaration import format_bytes
from tiletune.service.access.auth import Identity
from tiletune.service.configs import JobKey, tuned_on_newest_software
from tiletune.service.errors import ConflictError, ForbiddenError, InvalidInputError, NotFoundError
from tiletune.service.fleet import chip_by_name
from tiletune.service.models import JobRow, SweepRow, TrialRow
from tiletune.service.scheduling import lifecycle
from tiletune.service.specs import check_dtype, lookup_kernel, parse_shape
from tiletune.service.views import sweep_public

#: The most bytes a planned bench may hold, unless the settings say otherwise.
DEFAULT_MAX_SHAPE_BYTES = 8 * 2**30


@dataclass(frozen=True)
class PlannedJob:
    """One job a sweep will create."""

    spec: KernelDeclaration
    shape: Shape
    dtype: str
    chip_target: str


def plan_sweep(
    request: SweepCreate, max_jobs: int, max_shape_bytes: int = DEFAULT_MAX_SHAPE_BYTES
) -> list[PlannedJob]:
    """Every job of a valid sweep; :class:`InvalidInputError` naming the field otherwise.

    The job count is known before any job is built; a shape whose bench would hold more than
    ``max_shape_bytes`` (:meth:`KernelDeclaration.allocated_bytes`, in any of the sweep's dtypes)
    is refused, naming the shape, its biggest tensor with its bytes, and the limit.
    """
    for index, dtype in enumerate(request.dtypes):
        check_dtype(dtype, f"dtypes[{index}]")
    dtypes = list(dict.fromkeys(request.dtypes))
    chips = list(dict.fromkeys(request.chips)) or [ANY_CHIP]
    parts = _parse_parts(request, dtypes, max_shape_bytes)
    if request.with_backward:
        parts = _with_backward_parts(parts, dtypes, max_shape_bytes)
    for spec, _ in parts:
        declared = spec.implementations
        if request.backend is not None and request.backend not in declared:
            raise InvalidInputError(
                f"kernel {spec.name} has no backend {request.backend!r}; choose one of {list(declared)}",
                field="backend",
            )
    count = sum(len(shapes) for _, shapes in parts) * len(dtypes) * len(chips)
    if count > max_jobs:
        raise InvalidInputError(f"the sweep makes {count} jobs; at most {max_jobs} are allowed", "shapes")
    return [
        PlannedJob(spec, s, d, c) for spec, shapes in parts for s in shapes for d in dtypes for c in chips
    ]


def _parse_parts(
    request: SweepCreate, dtypes: Sequence[str], max_shape_bytes: int
) -> list[tuple[KernelDeclaration, list[Shape]]]:
    """Each kernel of the sweep with its parsed, de-duplicated shapes; errors name the field."""
    parts = []
    for position, part in enumerate(request.parts()):
        where = "" if request.kernel and position == 0 else f"kernels[{position - bool(request.kernel)}]."
        spec = lookup_kernel(part.kernel, field=f"{where}kernel")
        shapes = []
        for index, raw in enumerate(part.shapes):
            shape = parse_shape(spec, raw, f"{where}shapes[{index}]")
            check_bench_fits(spec, shape, dtypes, max_shape_bytes, f"{where}shapes[{index}]")
            shapes.append(shape)
        parts.append((spec, list({spec.canonical_shape(s): s for s in shapes}.values())))
    return parts


def _with_backward_parts(
    parts: list[tuple[KernelDeclaration, list[Shape]]], dtypes: Sequence[str], max_shape_bytes: int
) -> list[tuple[KernelDeclaration, list[Shape]]]:
    """``parts`` followed by the keys their backwards look up (:meth:`KernelDeclaration.backward_keys`),
    each kernel once, its shapes de-duplicated (a forward key already in the sweep is not repeated)."""
    shapes: dict[str, dict[str, Shape]] = {
        spec.name: {spec.canonical_shape(s): s for s in part} for spec, part in parts
    }
    specs = {spec.name: spec for spec, _ in parts}
    for spec, part in parts:
        for shape in part:
            for name, raw in spec.backward_keys(shape):
                backward = specs.setdefault(name, lookup_kernel(name, field="with_backward"))
                key = parse_shape(backward, dict(raw), "with_backward")
                check_bench_fits(backward, key, dtypes, max_shape_bytes, "with_backward")
                shapes.setdefault(name, {})[backward.canonical_shape(key)] = key
    return [(specs[name], list(keyed.values())) for name, keyed in shapes.items()]


def check_bench_fits(
    spec: KernelDeclaration, shape: Shape, dtypes: Sequence[str], max_shape_bytes: int, field: str
) -> None:
    """Refuse (naming ``field``) a shape whose bench would hold more than ``max_shape_bytes`` in one
    of ``dtypes`` (:meth:`KernelDeclaration.allocated_bytes`); the refusal names its biggest tensor."""
    dtype = max(dtypes, key=lambda name: spec.allocated_bytes(shape, name))
    held = spec.allocated_bytes(shape, dtype)
    if held <= max_shape_bytes:
        return
    tensors = spec.bench_bytes(shape, dtype)
    biggest = ""
    if tensors:
        name, size = max(tensors.items(), key=lambda item: item[1])
        biggest = f"; its biggest tensor, {name}, {format_bytes(size)} ({size} bytes)"
    raise InvalidInputError(
        f"a bench of this shape in {dtype} would hold {format_bytes(held)} (inputs, output, "
        f"reference){biggest}; at most {format_bytes(max_shape_bytes)} are allowed "
        "(TILETUNE_MAX_SHAPE_BYTES)",
        field,
    )


def create_sweep(
    session: Session,
    request: SweepCreate,
    planned: Sequence[PlannedJob],
    now: datetime,
    owner_token_id: int | None = None,
    *,
    idempotency_key: str | None = None,
) -> SweepPublic:
    """Write the sweep (of token ``owner_token_id``) and its jobs; the sweep as the API shows it.

    A key another live job tunes gets a job born ``skipped`` (``tuned_by`` that job), also when a
    concurrent sweep's job for it commits first (the database's ``uq_jobs_live_key`` refuses the
    second live job; the refused insert is rolled back alone, to a savepoint). With an
    ``idempotency_key``, the token's earlier sweep of that key is the answer (nothing written),
    and :class:`ConflictError` when it was made from another request."""
    scoped = (
        None
        if idempotency_key is None
        else f"{'-' if owner_token_id is None else owner_token_id}:{idempotency_key}"
    )
    digest = None if scoped is None else _request_digest(request)
    sweep = None if scoped is None else _sweep_of_key(session, scoped, digest)
    if sweep is not None:
        return sweep_public(session, sweep)
    sweep = SweepRow(
        name=request.name,
        kernels=list(dict.fromkeys(job.spec.name for job in planned)),
        request=request.model_dump(mode="json"),
        owner_token_id=owner_token_id,
        idempotency_key=scoped,
        request_digest=digest,
        created_at=now,
    )
    try:
        with session.begin_nested():
            session.add(sweep)
    except IntegrityError:  # a concurrent request of the same key committed its sweep first
        assert scoped is not None
        earlier = _sweep_of_key(session, scoped, digest)
        assert earlier is not None
        return sweep_public(session, earlier)
    for job in planned:
        _add_job(session, sweep.id, job, request, now)
    session.flush()
    return sweep_public(session, sweep)


def _request_digest(request: SweepCreate) -> str:
    """SHA-256 of ``request`` as canonical JSON (keys sorted): equal for equal requests."""
    canonical = json.dumps(request.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _sweep_of_key(session: Session, scoped_key: str, digest: str | None) -> SweepRow | None:
    """The sweep submitted under ``scoped_key``, or None; :class:`ConflictError` when its request's
    digest is not ``digest``."""
    sweep = session.scalar(select(SweepRow).where(SweepRow.idempotency_key == scoped_key))
    if sweep is not None and sweep.request_digest != digest:
        raise ConflictError(
            f"Idempotency-Key {scoped_key.partition(':')[2]!r} was used for another sweep request "
            f"(sweep {sweep.id}); send a new key for a new request",
            "Idempotency-Key",
        )
    return sweep


def _add_job(
    session: Session, sweep_id: int, planned: PlannedJob, request: SweepCreate, now: datetime
) -> None:
    """Add the sweep's job for ``planned``: see :func:`create_sweep`."""
    job = _new_job(session, sweep_id, planned, request, now)
    try:
        with session.begin_nested():
            session.add(job)
    except IntegrityError:  # a concurrent sweep's live job for this key committed first
        job = _new_job(session, sweep_id, planned, request, now)
        if job.tuned_by_job_id is None:
            raise
        session.add(job)


def _live_job_of(session: Session, job: JobRow) -> int | None:
    """The id of the live job of ``job``'s key (kernel, version, shape, dtype, chip target), or None."""
    return session.scalar(
        select(JobRow.id).where(
            JobRow.kernel == job.kernel,
            JobRow.kernel_version == job.kernel_version,
            JobRow.shape_key == job.shape_key,
            JobRow.dtype == job.dtype,
            JobRow.chip_target == job.chip_target,
            JobRow.state.in_(LIVE_JOB_STATES),
        )
    )


def _new_job(
    session: Session, sweep_id: int, planned: PlannedJob, request: SweepCreate, now: datetime
) -> JobRow:
    """The job of ``planned``, born as :func:`create_sweep` says."""
    spec = planned.spec
    chip = chip_by_name(session, planned.chip_target) if planned.chip_target != ANY_CHIP else None
    shape_key = spec.canonical_shape(planned.shape)
    tuned = (
        chip is not None
        and not request.force
        and tuned_on_newest_software(
            session, JobKey(spec.name, spec.version, shape_key, planned.dtype, chip.id)
        )
    )
    job = JobRow(
        sweep_id=sweep_id,
        kernel=spec.name,
        kernel_version=spec.version,
        shape=planned.shape,
        shape_key=shape_key,
        dtype=planned.dtype,
        chip_target=planned.chip_target,
        chip_id=chip.id if chip is not None else None,
        backend=request.backend,
        strategy=request.strategy,
        trials=request.trials,
        max_time_s=request.max_time_s,
        patience=request.patience,
        seed=request.seed,
        workers_per_job=request.workers_per_job,
        validate_top=request.validate_top,
        force=request.force,
        active_leases=0,
        lease_failures=0,
        failure_reasons=[],
        created_at=now,
        updated_at=now,
    )
    job.tuned_by_job_id = _live_job_of(session, job)
    job.state = lifecycle.born(already_tuned=tuned or job.tuned_by_job_id is not None)
    job.finished_at = now if lifecycle.is_final(job.state) else None
    return job


def job_row(session: Session, job_id: int) -> JobRow:
    """The job ``job_id``; :class:`NotFoundError` otherwise."""
    job = session.get(JobRow, job_id)
    if job is None:
        raise NotFoundError(f"no job {job_id}", field="job_id")
    return job


def sweep_row(session: Session, sweep_id: int) -> SweepRow:
    """The sweep ``sweep_id``; :class:`NotFoundError` otherwise."""
    sweep = session.get(SweepRow, sweep_id)
    if sweep is None:
        raise NotFoundError(f"no sweep {sweep_id}", field="sweep_id")
    return sweep


def check_owner(session: Session, sweep_id: int, caller: Identity) -> None:
    """Refuse (403) a change of sweep ``sweep_id`` by anyone but an admin or the token that submitted it."""
    sweep = sweep_row(session, sweep_id)
    if caller.may(Role.ADMIN):
        return
    if not caller.may(Role.SUBMITTER) or sweep.owner_token_id != caller.token_id:
        raise ForbiddenError(
            f"sweep {sweep_id} is another token's; only it or an admin may change it", "sweep_id"
        )


def sweep_rows(
    session: Session, limit: int = 50, offset: int = 0, before: int | None = None
) -> Sequence[SweepRow]:
    """Sweeps, newest first (only those older than sweep ``before`` when given), without their
    requests (a list never shows them)."""
    query = select(SweepRow).options(defer(SweepRow.request)).order_by(SweepRow.id.desc())
    if before is not None:
        query = query.where(SweepRow.id < before)
    return session.scalars(query.limit(limit).offset(offset)).all()


def job_rows(
    session: Session, state: JobState | None = None, limit: int = 100, offset: int = 0
) -> Sequence[JobRow]:
    """Jobs, newest first, optionally in one state."""
    query = select(JobRow).order_by(JobRow.id.desc()).limit(limit).offset(offset)
    if state is not None:
        query = query.where(JobRow.state == state)
    return session.scalars(query).all()


def job_rows_of_sweep(session: Session, sweep_id: int) -> Sequence[JobRow]:
    """The jobs of a sweep, in order; :class:`NotFoundError` for no sweep."""
    sweep_row(session, sweep_id)
    return session.scalars(select(JobRow).where(JobRow.sweep_id == sweep_id).order_by(JobRow.id)).all()


def trial_rows(session: Session, job_id: int) -> Sequence[TrialRow]:
    """Every trial of a job, in the order asked (validation runs last); :class:`NotFoundError` for no job."""
    job_row(session, job_id)
    return session.scalars(select(TrialRow).where(TrialRow.job_id == job_id).order_by(TrialRow.id)).all()
