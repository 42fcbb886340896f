"""The fleet: chips and their limits, software fingerprints, workers. A repository.

Functions take the caller's session and never commit (see :mod:`tiletune.service.database`).

- :func:`register_worker` records the worker under the caller's token (with the backends it
  offers per kernel, when it reports them: what it leases), its chip and the software
  fingerprint beside it. A chip is created only with :class:`ChipRights` ``create``
  (workers' tokens, where the settings allow), and an existing chip's kind or limits change
  only with ``change`` (an admin's): anyone else gets 403 and nothing changes. The any-chip
  marker ``*`` is no chip's name, and a new name that differs from a registered one only in
  case or spaces (:func:`look_alike_key`) is 409: look-alike names name one chip;
- :func:`touch_worker` finds a worker of the caller's token and marks it seen (every lease
  call does); another token's worker is 403;
- :func:`hold_to_chip` keeps a worker token to one chip: the one named when it was created, else
  the one it first registers (or leases for); another chip is 403 with a message that names no
  chip and no limits. A token bound to ``*`` (an admin's choice) works for every chip; an
  admin's token is never bound;
- a software fingerprint is stored once per (chip, canonical JSON text);
- :func:`listed_workers` lists workers with their chip, software and live leases.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from tiletune.client.wire import ANY_CHIP, ChipWire, ListedWorkerPublic, WorkerCreate, software_text
from tiletune.kernels import DeviceLimits
from tiletune.service.database import aware
from tiletune.service.errors import ConflictError, ForbiddenError, InvalidInputError, NotFoundError
from tiletune.service.models import ChipRow, LeaseRow, SoftwareRow, TokenRow, WorkerRow

#: The refusal of a worker token's call for a chip other than its own: it names neither chip.
BOUND_ELSEWHERE = (
    "this token is bound to another chip; an admin makes a worker token for this one "
    "(tiletune token create --role worker --chip NAME)"
)


def fingerprint_text(software: dict[str, str | None]) -> str:
    """A software fingerprint as canonical JSON (equal text means equal software)."""
    return software_text(software)


def chip_limits(chip: ChipRow) -> DeviceLimits:
    """The limits a chip registered, which its jobs' spaces and constraints are built with (its kind
    too: some constraints differ on NPUs; its cores where a worker reported them)."""
    return DeviceLimits(
        chip.local_memory_bytes, chip.max_buffer_num, chip.alignment_bytes, kind=chip.kind, cores=chip.cores
    )


def chip_by_name(session: Session, name: str) -> ChipRow | None:
    """The chip registered under ``name``, if any."""
    return session.scalar(select(ChipRow).where(ChipRow.name == name))


@dataclass(frozen=True)
class ChipRights:
    """What a registration may do to chips: create a new one, change an existing one's limits."""

    create: bool = True
    change: bool = False


def register_worker(
    session: Session,
    request: WorkerCreate,
    now: datetime,
    token_id: int | None,
    rights: ChipRights,
    *,
    hold_token: bool = False,
) -> tuple[WorkerRow, ChipRow]:
    """Record a worker of token ``token_id``, its chip and its software fingerprint.

    ``hold_token``: the token works for one chip (a worker's: :func:`hold_to_chip`), checked
    after the request itself and before the chip is looked at.
    """
    for index, backend in enumerate(request.backends):
        if not backend:
            raise InvalidInputError("backend names must not be empty", field=f"backends[{index}]")
    if request.chip.name == ANY_CHIP:
        raise InvalidInputError(f"{ANY_CHIP!r} means any chip and names none", field="chip.name")
    if hold_token:
        hold_to_chip(session, token_id, request.chip.name, "chip.name")
    chip = _upsert_chip(session, request.chip, now, rights)
    software = software_row(session, chip.id, request.software, now)
    worker = WorkerRow(
        name=request.name,
        chip_id=chip.id,
        software_id=software.id,
        backends=list(request.backends),
        kernels=list(request.kernels),
        kernel_versions=dict(request.kernel_versions),
        kernel_backends=(
            {kernel: list(backends) for kernel, backends in request.kernel_backends.items()}
            if request.kernel_backends is not None
            else None
        ),
        token_id=token_id,
        registered_at=now,
        last_seen_at=now,
    )
    session.add(worker)
    session.flush()
    return worker, chip


def _limits(chip: ChipRow) -> tuple[str, int, int, int, int | None]:
    return (chip.kind, chip.local_memory_bytes, chip.max_buffer_num, chip.alignment_bytes, chip.cores)


def look_alike_key(name: str) -> str:
    """What two chip names that look alike share: each ``/``-part case-folded, its spaces collapsed."""
    return "/".join(" ".join(part.casefold().split()) for part in name.split("/"))


def refuse_look_alike(session: Session, name: str) -> None:
    """Refuse a new chip name that differs from a registered one only in case or spaces (409).

    The very name registered is no look-alike: a concurrent registration of the same chip may
    commit between the caller's lookup and this read (PostgreSQL reads each statement's committed
    rows); the caller's insert then meets the unique name and registers again.
    """
    key = look_alike_key(name)
    for registered in session.scalars(select(ChipRow.name)):
        if registered != name and look_alike_key(registered) == key:
            raise ConflictError(
                f"chip name {name!r} differs from the registered {registered!r} only in case or spaces: "
                f"names that look alike name one chip; register as {registered!r}",
                field="chip.name",
            )


def _upsert_chip(session: Session, wire: ChipWire, now: datetime, rights: ChipRights) -> ChipRow:
    """The chip of ``wire``, created or changed as ``rights`` allow.

    Cores a worker does not report (an older worker) are no change: the chip keeps the cores it
    has; cores reported for a chip that has none yet are recorded, whoever registers.
    """
    chip = chip_by_name(session, wire.name)
    cores = wire.cores if wire.cores is not None else chip.cores if chip is not None else None
    wanted = (wire.kind, wire.local_memory_bytes, wire.max_buffer_num, wire.alignment_bytes, cores)
    if chip is not None and chip.cores is None and cores is not None and _limits(chip)[:4] == wanted[:4]:
        chip.cores = cores
        chip.updated_at = now
        session.flush()
        return chip
    if chip is None:
        if not rights.create:
            raise ForbiddenError(f"no chip {wire.name!r} is registered; an admin registers new chips", "chip")
        refuse_look_alike(session, wire.name)
        chip = ChipRow(name=wire.name, created_at=now)
        session.add(chip)
    elif _limits(chip) == wanted:
        return chip
    elif not rights.change:
        # The refusal names none of the registered limits: only an admin may read or change them.
        raise ForbiddenError(
            f"chip {wire.name!r} is registered with other limits; an admin changes them", "chip"
        )
    chip.kind = wire.kind
    chip.local_memory_bytes = wire.local_memory_bytes
    chip.max_buffer_num = wire.max_buffer_num
    chip.alignment_bytes = wire.alignment_bytes
    chip.cores = cores
    chip.updated_at = now
    session.flush()
    return chip


def software_row(
    session: Session, chip_id: int, software: dict[str, str | None], now: datetime
) -> SoftwareRow:
    """The row of a chip's software fingerprint, created on first sight."""
    text = fingerprint_text(software)
    row = session.scalar(
        select(SoftwareRow).where(SoftwareRow.chip_id == chip_id, SoftwareRow.fingerprint == text)
    )
    if row is None:
        row = SoftwareRow(chip_id=chip_id, fingerprint=text, first_seen_at=now)
        session.add(row)
        session.flush()
    return row


def newest_software_id(session: Session, chip_id: int) -> int | None:
    """The id of the software the chip's workers registered last."""
    return session.scalar(
        select(SoftwareRow.id)
        .where(SoftwareRow.chip_id == chip_id)
        .order_by(SoftwareRow.first_seen_at.desc(), SoftwareRow.id.desc())
        .limit(1)
    )


def touch_worker(session: Session, worker_id: int, now: datetime, token_id: int | None) -> WorkerRow:
    """The worker ``worker_id`` of token ``token_id``, marked seen at ``now``.

    :class:`NotFoundError` when there is none (or it was registered before tokens: register
    again), :class:`ForbiddenError` when another token registered it.
    """
    worker = session.get(WorkerRow, worker_id)
    if worker is None or worker.token_id is None:
        raise NotFoundError(f"no worker {worker_id}; register first", field="worker_id")
    if worker.token_id != token_id:
        raise ForbiddenError(f"worker {worker_id} is another token's", field="worker_id")
    worker.last_seen_at = now
    return worker


def hold_to_chip(session: Session, token_id: int | None, chip_name: str, field: str) -> None:
    """Keep worker token ``token_id`` to one chip: bind it to ``chip_name`` if it is unbound, else
    :class:`ForbiddenError` (:data:`BOUND_ELSEWHERE`) unless it is bound to ``chip_name`` or ``*``.

    The binding is a conditional update, so of two first calls for different chips at once one
    binds and the other is refused; a transaction that fails later takes the binding back with it.
    """
    if token_id is None:
        return
    bound = _bound_chip(session, token_id)
    if bound is None:
        session.execute(
            update(TokenRow)
            .where(TokenRow.id == token_id, TokenRow.chip_name.is_(None))
            .values(chip_name=chip_name)
        )
        bound = _bound_chip(session, token_id)
    if bound not in (chip_name, ANY_CHIP):
        raise ForbiddenError(BOUND_ELSEWHERE, field)


def _bound_chip(session: Session, token_id: int) -> str | None:
    return session.scalar(select(TokenRow.chip_name).where(TokenRow.id == token_id))


def listed_workers(
    session: Session, limit: int, since: datetime | None, now: datetime
) -> list[ListedWorkerPublic]:
    """Workers (the most recently seen first, at most ``limit``, seen since ``since`` when given), each
    with its chip, software and the jobs it holds a live lease on at ``now`` (``GET /v1/workers``)."""
    query = (
        select(WorkerRow, ChipRow.name, SoftwareRow.fingerprint)
        .join(ChipRow, ChipRow.id == WorkerRow.chip_id)
        .join(SoftwareRow, SoftwareRow.id == WorkerRow.software_id)
        .order_by(WorkerRow.last_seen_at.desc(), WorkerRow.id.desc())
        .limit(limit)
    )
    if since is not None:
        query = query.where(WorkerRow.last_seen_at >= since)
    rows = session.execute(query).all()
    leased: defaultdict[int, list[int]] = defaultdict(list)
    if rows:
        live = (
            select(LeaseRow.worker_id, LeaseRow.job_id)
            .where(LeaseRow.worker_id.in_([worker.id for worker, _, _ in rows]))
            .where(LeaseRow.ended_at.is_(None), LeaseRow.expires_at > now)
            .order_by(LeaseRow.job_id)
        )
        for worker_id, job_id in session.execute(live):
            leased[worker_id].append(job_id)
    return [
        ListedWorkerPublic(
            id=worker.id,
            name=worker.name,
            chip=chip,
            backends=list(worker.backends),
            kernels=list(worker.kernels),
            software=json.loads(fingerprint),
            registered_at=aware(worker.registered_at),
            last_seen_at=aware(worker.last_seen_at),
            leased_jobs=leased[worker.id],
        )
        for worker, chip, fingerprint in rows
    ]
