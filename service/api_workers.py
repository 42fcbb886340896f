"""The worker protocol over HTTP: ``/v1/workers``, ``/v1/leases``, and each lease's calls.

A lease's calls are ``/v1/lease/{heartbeat,ask,tell,complete,release}`` with the lease token in
the ``X-Lease-Token`` header: no secret in a URL, so none in an access log.

``GET /v1/workers`` lists the registered workers (a reader's token, or none when reads are open).
Every other route needs a ``worker`` (or ``admin``) token; a lease is written to only with the token
that registered its worker (403 otherwise). A worker token works for one chip: the one it was
created for (``tiletune token create --role worker --chip NAME``), else the one it first
registered; registering or leasing for another is 403 (an admin's token works for any).
A 409 with code ``lease_lost`` answers any write
under a lease that expired, ended or never existed; it changes nothing.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response
from pydantic import Field

from tiletune.client.wire import (
    LEASE_TOKEN_HEADER,
    MAX_ASK,
    MAX_DB_INT,
    MAX_HOLDING,
    WORKERS_PAGE_DEFAULT,
    WORKERS_PAGE_MAX,
    AskPublic,
    CompleteCreate,
    JobPublic,
    LeaseCreate,
    LeasePublic,
    ListedWorkerPublic,
    ReleaseCreate,
    TellCreate,
    TellPublic,
    WorkerCreate,
    WorkerPublic,
)
from tiletune.service import fleet
from tiletune.service.dependencies import DatabaseDep, ProtocolDep, ReaderDep, WorkerDep

router = APIRouter(prefix="/v1", tags=["workers"])


@router.post("/workers", status_code=201)
def register_worker(
    worker: WorkerCreate, protocol: ProtocolDep, caller: WorkerDep, request: Request
) -> WorkerPublic:
    """Register a worker with its chip (name, limits), backends and software, under the caller's token.

    403 for a chip other than the worker token's own (its first registration binds an unbound one).
    Software new to the chip turns its bests measured with other software stale: right after, the
    most launched of them are queued for re-tuning, at most ``TILETUNE_RETUNE_BUDGET`` per change
    (see ``tiletune.service.demand.retune``).
    """
    registered = protocol.register(worker, caller)
    request.app.state.services.retune.after_registration(worker.chip.name)
    return registered


WorkersLimit = Annotated[int, Query(ge=1, le=WORKERS_PAGE_MAX, description="the most workers listed")]
#: The longest ``seen_within_s`` (a year): a bound on the input, not on what a fleet keeps.
MAX_SEEN_WITHIN_S = 366 * 24 * 3600.0
SeenWithin = Annotated[
    float | None,
    Query(
        gt=0,
        le=MAX_SEEN_WITHIN_S,
        allow_inf_nan=False,
        description="only workers seen (registered, leased, heartbeat) within this many seconds",
    ),
]


@router.get("/workers")
def list_workers(
    db: DatabaseDep,
    _reader: ReaderDep,
    limit: WorkersLimit = WORKERS_PAGE_DEFAULT,
    seen_within_s: SeenWithin = None,
) -> list[ListedWorkerPublic]:
    """Registered workers, the most recently seen first, each with its chip, backends, kernels,
    software and the jobs it holds a live lease on now.

    Every start of a worker process registers a new worker, so the list holds past ones too:
    ``seen_within_s`` keeps those seen within that many seconds (e.g. the lease time: the live
    fleet). ``limit``: at most this many (default 100, at most 1000).
    """
    now = db.clock()
    since = now - timedelta(seconds=seen_within_s) if seen_within_s is not None else None
    with db.read() as session:
        return fleet.listed_workers(session, limit, since, now)


@router.post(
    "/leases",
    status_code=201,
    response_model=LeasePublic,
    responses={204: {"description": "no job for this worker now"}},
)
def lease_job(request: LeaseCreate, protocol: ProtocolDep, caller: WorkerDep) -> LeasePublic | Response:
    """Lease the oldest job this worker's chip and backends can run (204 when there is none).

    The worker must be one the caller's token registered, on the token's chip (403 otherwise).
    """
    lease = protocol.lease(request.worker_id, caller)
    return lease if lease is not None else Response(status_code=204)


AskCount = Annotated[int, Query(ge=1, le=MAX_ASK, description="the most configs to hand out")]
Holding = Annotated[
    list[Annotated[int, Field(ge=0, le=MAX_DB_INT)]],
    Query(
        max_length=MAX_HOLDING,
        description="trial ids the worker has in hand; the lease's other outstanding trials come first",
    ),
]
LeaseToken = Annotated[
    str,
    Header(
        alias=LEASE_TOKEN_HEADER,
        min_length=1,
        max_length=200,
        description="the lease's fencing token, from POST /v1/leases",
    ),
]


@router.post("/lease/heartbeat")
def lease_heartbeat(token: LeaseToken, protocol: ProtocolDep, caller: WorkerDep) -> LeasePublic:
    """Renew the lease named by the ``X-Lease-Token`` header for another lease period."""
    return protocol.heartbeat(token, caller)


@router.post("/lease/ask")
def lease_ask(
    token: LeaseToken,
    protocol: ProtocolDep,
    caller: WorkerDep,
    n: AskCount = 1,
    holding: Holding = [],  # noqa: B006 (FastAPI copies defaults per request)
) -> AskPublic:
    """Up to ``n`` configs to measure, or the final validation, or ``wait`` / ``done``.

    Idempotent: the lease's outstanding trials that are not in ``holding`` are answered first.
    """
    return protocol.ask(token, caller, n, holding)


@router.post("/lease/tell")
def lease_tell(
    token: LeaseToken, outcomes: TellCreate, protocol: ProtocolDep, caller: WorkerDep
) -> TellPublic:
    """Outcomes of asked trials; repeating a tell is counted once."""
    return protocol.tell(token, caller, outcomes)


@router.post("/lease/complete")
def lease_complete(
    token: LeaseToken, results: CompleteCreate, protocol: ProtocolDep, caller: WorkerDep
) -> JobPublic:
    """The interleaved validation run: promotes the winner if it beats the key's best; ends the job."""
    return protocol.complete(token, caller, results)


@router.post("/lease/release")
def lease_release(
    token: LeaseToken, request: ReleaseCreate, protocol: ProtocolDep, caller: WorkerDep
) -> JobPublic:
    """Give the lease back; outstanding trials are asked again; ``failed`` counts toward the job's limit."""
    return protocol.release(token, caller, request)
