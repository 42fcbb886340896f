"""The FastAPI application factory: ``create_app(settings)``.

Builds the engines, database, queue, searches, worker protocol and miss counter for the given
settings (nothing at import time), mounts the ``/v1`` routers, turns every
:class:`~tiletune.service.errors.ServiceError` and validation error into a
JSON ``ErrorBody`` (validation errors name the field; a 405 names the path's methods in
``Allow``), guards request bodies (:mod:`tiletune.service.access.bodies`: a cap per route under
``max_body_bytes``, a deadline, large ones checked off the event loop), gives every request an
id and an access line (:mod:`tiletune.service.request_ids`), traces when configured
(:mod:`tiletune.service.tracing`), and, while serving, returns the jobs of expired leases to
the queue every ``reap_interval_s``.

The schema is not created here: ``tiletune server`` runs the migrations
first (:func:`tiletune.service.migrate.upgrade`), or ``tiletune migrate`` did before a
``tiletune server --no-migrate``.
"""

from __future__ import annotations

import gc
import logging
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import compile_path

from tiletune.client.wire import REQUEST_ID_HEADER, ErrorBody
from tiletune.service import api_configs, api_misses, api_sweeps, api_tokens, api_workers, dashboard, tracing
from tiletune.service.access.auth import Identity, Tokens
from tiletune.service.access.bodies import BodyGuard
from tiletune.service.access.body_json import error_field_and_message, not_json_message
from tiletune.service.access.ratelimit import RateLimiter
from tiletune.service.database import Clock, Database, disk_full, is_sqlite, make_engine, make_sessions
from tiletune.service.demand.misses import Misses
from tiletune.service.demand.policy import MissPolicy
from tiletune.service.demand.retune import RetunePolicy, Retuner
from tiletune.service.dependencies import authenticate
from tiletune.service.errors import ServiceError, StorageFullError, UnavailableError, error_headers
from tiletune.service.metrics import RequestTimer, ServiceMetrics
from tiletune.service.reads import Reads
from tiletune.service.request_ids import RequestIds, current_request_id
from tiletune.service.scheduling.protocol import WorkerProtocol
from tiletune.service.scheduling.queue import JobQueue, LeaseSettings
from tiletune.service.scheduling.searches import SearchHost
from tiletune.service.scheduling.store_clock import StoreClock
from tiletune.service.settings import Settings

log = logging.getLogger(__name__)

#: The error statuses any route may answer, each with the ``ErrorBody`` body (documented in OpenAPI).
ERRORS = {
    400: "the body could not be read (not UTF-8 or not JSON)",
    401: "no token, or an unknown or revoked one",
    403: "the token's role or owner does not allow it",
    404: "no such route or thing",
    405: "the route has no such method (``Allow`` names the path's methods)",
    408: "the body did not arrive in time (body_timeout; the connection is closed)",
    409: "the request clashes with the state (lease_lost: the lease ended)",
    413: "the body is over a limit: its route's bytes, or its JSON's depth, keys, elements or values",
    422: "a field is invalid; ``field`` names it",
    500: "a bug in the server (internal_error: the exception's type; the server logs the rest)",
    429: "too many requests of this kind from this token, or failed authentications from this "
    "address (see Retry-After)",
    503: "the database cannot be reached now (database_unavailable; see Retry-After)",
    507: "the database's disk is full: nothing was written (storage_full; see Retry-After)",
}

#: The errors of a database that cannot be reached (503; or 507 when its disk is full).
DATABASE_FAULTS = (OperationalError, InterfaceError, DisconnectionError, PoolTimeoutError)
#: Seconds a 503 ``database_unavailable`` asks callers to wait before trying again.
DATABASE_RETRY_AFTER_S = 2.0

#: SQLite read connections: as many as the request threads (FastAPI's default limit is 40), so
#: concurrent lookups never queue for a connection (SQLite readers do not block each other).
READ_POOL_SIZE = 40


@dataclass
class Services:
    """What the routes use, built once per app (``app.state.services``)."""

    settings: Settings
    db: Database
    queue: JobQueue
    protocol: WorkerProtocol
    reads: Reads
    misses: Misses
    tokens: Tokens
    miss_limit: RateLimiter
    metrics: ServiceMetrics
    #: Failed authentications by client address (``TILETUNE_AUTH_FAILURES_PER_S``, ``..._BURST``).
    auth_failures: RateLimiter
    #: Re-tuning after software changes (``TILETUNE_RETUNE_BUDGET``).
    retune: Retuner
    #: Sweeps by token (``TILETUNE_SWEEPS_PER_S``, ``TILETUNE_SWEEP_BURST``).
    sweep_limit: RateLimiter
    #: The store's clock, when the app reads it (no clock injected); re-measured by the reaper.
    store_clock: StoreClock | None


def build_services(settings: Settings, clock: Clock | None = None) -> Services:
    """Engines, database, queue, searches and protocol for ``settings``; times from ``clock``, by
    default the store's (:class:`~tiletune.service.scheduling.store_clock.StoreClock`, measured here
    first)."""
    writes = make_engine(settings.db_url)
    store_clock = None
    if clock is None:
        clock = store_clock = StoreClock(writes)
        store_clock.measure()
    reads = (
        make_engine(settings.db_url, write_lock=False, pool_size=READ_POOL_SIZE)
        if is_sqlite(settings.db_url)
        else writes
    )
    db = Database(make_sessions(writes), clock, reads=make_sessions(reads))
    queue = JobQueue(
        db,
        LeaseSettings(settings.lease_s, settings.heartbeat_s, settings.max_lease_failures),
    )
    misses = Misses(
        db,
        MissPolicy(
            threshold=settings.miss_queue_threshold,
            trials=settings.miss_trials,
            jobs_per_chip_hour=settings.demand_jobs_per_chip_hour,
            max_shape_bytes=settings.max_shape_bytes,
            max_jobs_per_sweep=settings.max_jobs_per_sweep,
        ),
    )
    tokens = Tokens(db)
    metrics = ServiceMetrics(db, online_s=settings.lease_s, db_url=settings.db_url)
    if store_clock is not None:
        measured = store_clock
        metrics.clock_skew.set_function(lambda: measured.skew_s)
    if settings.admin_token is not None:  # first: the database's first admin, if it has none
        tokens.bootstrap(settings.admin_token.get_secret_value())
    if settings.worker_token is not None:
        tokens.provision_worker(settings.worker_token.get_secret_value())
    read_side = Reads.of(db, settings.index_check_s, settings.lookup_cache_s, metrics)
    retune = RetunePolicy(
        budget=settings.retune_budget,
        trials=settings.miss_trials,
        max_shape_bytes=settings.max_shape_bytes,
        max_jobs_per_sweep=settings.max_jobs_per_sweep,
    )
    return Services(
        settings,
        db,
        queue,
        WorkerProtocol(db, queue, SearchHost(), metrics, settings.workers_create_chips),
        read_side,
        misses,
        tokens,
        RateLimiter(settings.miss_reports_per_s, settings.miss_report_burst),
        metrics,
        RateLimiter(settings.auth_failures_per_s, settings.auth_failure_burst),
        Retuner(db, read_side.usage, retune),
        RateLimiter(settings.sweeps_per_s, settings.sweep_burst),
        store_clock,
    )


def create_app(settings: Settings | None = None, clock: Clock | None = None, reaper: bool = True) -> FastAPI:
    """The tiletune API for ``settings`` (default: from the environment); see the module docstring."""
    services = build_services(settings or Settings(), clock)
    app = FastAPI(
        title="tiletune",
        version="1",
        summary="Tiling autotuning service: sweeps, jobs, worker leases and best configs.",
        lifespan=_lifespan(services, reaper),
        docs_url=None,  # served by the dashboard with local assets (tiletune.service.dashboard.docs)
        redoc_url=None,
        responses={status: {"model": ErrorBody, "description": why} for status, why in ERRORS.items()},
    )
    app.state.services = services
    routers = (  # matched in this order: the lookups (the hottest routes) first
        api_configs.router,
        api_sweeps.router,
        api_workers.router,
        api_misses.router,
        api_tokens.router,
    )
    for router in routers:
        app.include_router(router)
    dashboard.mount(app)
    app.state.path_methods = _path_methods(app, [*routers, *dashboard.ROUTERS])
    _handle_errors(app)

    async def authenticate_caller(secret: str, address: str) -> Identity:
        return await authenticate(services.tokens, services.auth_failures, secret, address)

    app.add_middleware(
        BodyGuard,
        ceiling_bytes=services.settings.max_body_bytes,
        timeout_s=services.settings.body_timeout_s,
        authenticate=authenticate_caller,
    )
    app.add_middleware(RequestTimer, metrics=services.metrics)
    app.add_middleware(RequestIds)  # outermost of ours: the id is set for everything inside
    app.state.tracing = tracing.instrument(app, services.db, services.settings.otel)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


def _lifespan(services: Services, reaper: bool) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """While serving: the index loaded first, then the reaper (when ``reaper``) and the index's watcher
    running in threads, stopped at shutdown."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await run_in_threadpool(_load_index, services)
        # What lives as long as the process (the libraries, the index just loaded) leaves the
        # collector's full scans: one took ~100 ms here, a pause every request near it waited out.
        gc.freeze()
        stop = threading.Event()
        thread = None
        if reaper:
            thread = threading.Thread(target=_reap_forever, args=(services, stop), daemon=True, name="reaper")
            thread.start()
        watcher = threading.Thread(target=services.reads.index.watch, args=(stop,), daemon=True, name="index")
        watcher.start()
        yield
        stop.set()
        if thread is not None:
            thread.join(timeout=5)
        watcher.join(timeout=5)
        services.metrics.close()  # another replica exports the store's gauges from now on

    return lifespan


def _handle_errors(app: FastAPI) -> None:
    """Answer every error as a JSON ``ErrorBody`` (see the module docstring)."""
    app.add_exception_handler(ServiceError, _service_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _internal_error)
    for database_fault in DATABASE_FAULTS:
        app.add_exception_handler(database_fault, _database_error)


def _openapi(app: FastAPI) -> dict[str, Any]:
    """The OpenAPI document, made once: FastAPI's, with every error answer as it is sent.

    Errors are JSON ``ErrorBody`` on every route (FastAPI would give a plain-text route, such
    as ``/metrics``, its own media type for them too), and a 405 carries ``Allow``.
    """
    if app.openapi_schema is not None:
        return app.openapi_schema
    document = FastAPI.openapi(app)
    error_body = {"$ref": "#/components/schemas/ErrorBody"}
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            for status, answer in operation.get("responses", {}).items():
                if status.isdigit() and int(status) in ERRORS:
                    answer["content"] = {"application/json": {"schema": error_body}}
                if status == "405":
                    answer["headers"] = {
                        "Allow": {"description": "the path's methods", "schema": {"type": "string"}}
                    }
    app.openapi_schema = document
    return document


def _load_index(services: Services) -> None:
    """Load the index of best configs before serving (a database away now: the first lookup will)."""
    try:
        services.reads.index.refresh()
    except Exception:
        log.exception("loading the index of best configs failed; lookups will try again")


def _reap_forever(services: Services, stop: threading.Event) -> None:
    """Every ``reap_interval_s``: measure the store's clock again when due, return expired leases'
    jobs to the queue, then run a demand pass (the demand budget's hour slides on; keys whose live
    job ended become eligible) and plan re-tuning for software changes not planned yet; every
    ``usage_flush_s``, store the launches per key first."""
    flushed_at = time.monotonic()
    while not stop.wait(services.settings.reap_interval_s):
        if services.store_clock is not None:
            services.store_clock.check()  # before the expiry it judges
        try:
            reaped = services.protocol.reap()
        except Exception:
            log.exception("reaping expired leases failed; trying again")
        else:
            if reaped:
                log.info("returned %d job(s) of expired leases to the queue", reaped)
        try:
            demanded = services.misses.plan_demand(wait=False)
        except Exception:
            log.exception("queueing demand jobs failed; trying again")
        else:
            if demanded:
                log.info("queued %d demand job(s) for missed keys", len(demanded))
        flush = time.monotonic() - flushed_at >= services.settings.usage_flush_s
        if flush:
            flushed_at = time.monotonic()
        _retune_pending(services, flush)


def _retune_pending(services: Services, flush: bool) -> None:
    """Store this replica's launches per key when ``flush``, then plan any software change not
    planned yet (a plan stores them first)."""
    try:
        if flush:
            services.reads.usage.flush(services.db)
        planned = services.retune.plan_pending()
    except Exception:
        log.exception("storing launches or planning re-tuning failed; trying again")
    else:
        for plan in planned:
            if plan.job_ids:
                log.info("queued %d re-tuning job(s) for chip %d", len(plan.job_ids), plan.chip_id)


def _error(
    request: Request, body: ErrorBody, status: int, headers: Mapping[str, str] | None = None
) -> Response:
    """The error's JSON body; a browser's page request gets it as a dashboard page instead."""
    page = dashboard.error_page(request, body, status, headers)
    if page is not None:
        return page
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


async def _service_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, ServiceError)
    body = ErrorBody(code=error.code, message=error.message, field=error.field)
    return _error(request, body, error.status, error_headers(error) or None)


async def _internal_error(request: Request, error: Exception) -> Response:
    """A bug: 500 ``internal_error`` naming the exception's type (never its text: it may hold data).

    A database fault raised outside the routes (the body guard authenticates a large body's
    caller before any route runs) is the database's all the same: :func:`_database_error`.
    """
    if isinstance(error, DATABASE_FAULTS):
        return await _database_error(request, error)
    where = f"{request.method} {request.url.path}"
    message = f"internal error ({type(error).__name__}) in {where}; see the server's log"
    request_id = current_request_id.get()  # still set: the request raised (tiletune.service.request_ids)
    headers = {REQUEST_ID_HEADER: request_id} if request_id else None
    body = ErrorBody(code="internal_error", message=message).model_dump()
    return JSONResponse(body, status_code=500, headers=headers)


async def _database_error(request: Request, error: Exception) -> Response:
    """A database that went away (connection refused or dropped, pool exhausted, SQLite locked): 503;
    one whose disk is full (:func:`~tiletune.service.database.disk_full`): 507 ``storage_full``.

    Only connection-level faults come here: an integrity or programming error is a bug (500).
    The message names no URL or credential; the pool's pre-ping replaces dead connections.
    """
    if disk_full(error):
        log.error("the database's disk is full (%s %s): nothing written", request.method, request.url.path)
        full = StorageFullError(
            "the database's disk is full: nothing was written; free space on it, then try again",
            DATABASE_RETRY_AFTER_S,
        )
        return await _service_error(request, full)
    log.warning("database unavailable for %s %s: %s", request.method, request.url.path, type(error).__name__)
    unavailable = UnavailableError("the database cannot be reached now; try again", DATABASE_RETRY_AFTER_S)
    return await _service_error(request, unavailable)


async def _validation_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, RequestValidationError)
    errors = error.errors()
    first: dict[str, Any] = dict(errors[0]) if errors else {"loc": (), "msg": "invalid request"}
    return _error(request, _invalid(first), 422)


def _invalid(first: dict[str, Any]) -> ErrorBody:
    """The 422 of a request's first validation error (a body that is not JSON says where it stops)."""
    location = tuple(first.get("loc", ()))
    if first.get("type") == "json_invalid":  # located at ("body", the byte where parsing stopped)
        reason = str((first.get("ctx") or {}).get("error", first.get("msg")))
        position = location[-1] if location and isinstance(location[-1], int) else 0
        return ErrorBody(code="invalid", message=not_json_message(reason, position), field="body")
    field, message = error_field_and_message(location, str(first.get("msg")))
    return ErrorBody(code="invalid", message=message, field=field)


#: Codes of the errors the framework raises itself (an unknown route, a method it has not).
HTTP_CODES = {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 413: "too_large"}


async def _http_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, StarletteHTTPException)
    code = HTTP_CODES.get(error.status_code, "http_error")
    body = ErrorBody(code=code, message=str(error.detail))
    headers = dict(error.headers or {})
    if error.status_code == 405:
        headers["Allow"] = ", ".join(_methods_of(request))
    return _error(request, body, error.status_code, headers or None)


def _methods_of(request: Request) -> list[str]:
    """The methods the request's path takes (sorted): those of the routes whose template is the
    path itself (``/v1/configs/import``) if any, else of every route whose template matches it."""
    path = request.url.path
    literal: set[str] = set()
    matching: set[str] = set()
    for pattern, template, methods in request.app.state.path_methods:
        if pattern.match(path):
            matching.update(methods)
            if template == path:
                literal.update(methods)
    return sorted(literal or matching)


def _path_methods(app: FastAPI, routers: Sequence[APIRouter]) -> list[tuple[re.Pattern[str], str, set[str]]]:
    """Each route's path pattern, template and methods: those of ``routers``, and the app's own."""
    table = []
    for route in [*(route for router in routers for route in router.routes), *app.router.routes]:
        template, methods = getattr(route, "path", None), getattr(route, "methods", None)
        if isinstance(template, str) and methods:
            table.append((compile_path(template)[0], template, set(methods)))
    return table
