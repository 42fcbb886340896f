"""The FastAPI application factory: ``create_app(settings)``.

Builds the engines, database, queue, searches, worker protocol and miss counter for the given
settings (nothing at import time), mounts the ``/v1`` routers, turns every
:class:`~tiletune.service.errors.ServiceError` and validation error into a
JSON ``ErrorBody`` (validation errors name the field), refuses bodies over
``max_body_bytes`` (413), and, while serving, returns the jobs of expired
leases to the queue every ``reap_interval_s``.

The schema is not created here: ``tiletune server`` runs the migrations
first (:func:`tiletune.service.migrate.upgrade`).
"""

from __future__ import annotations

import gc
import logging
import math
import threading
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tiletune.client.wire import ErrorBody
from tiletune.service import api_configs, api_misses, api_sweeps, api_tokens, api_workers, dashboard
from tiletune.service.auth import Tokens
from tiletune.service.database import Clock, Database, is_sqlite, make_engine, make_sessions, utc_now
from tiletune.service.errors import RateLimitedError, ServiceError, UnauthorizedError, UnavailableError
from tiletune.service.metrics import RequestTimer, ServiceMetrics
from tiletune.service.misses import Misses, MissPolicy
from tiletune.service.protocol import WorkerProtocol
from tiletune.service.queue import JobQueue, LeaseSettings
from tiletune.service.ratelimit import RateLimiter
from tiletune.service.reads import Reads
from tiletune.service.searches import SearchHost
from tiletune.service.settings import Settings

log = logging.getLogger(__name__)

#: The error statuses any route may answer, each with the ``ErrorBody`` body (documented in OpenAPI).
ERRORS = {
    400: "the body could not be read (not UTF-8 or not JSON)",
    401: "no token, or an unknown or revoked one",
    403: "the token's role or owner does not allow it",
    404: "no such route or thing",
    405: "the route has no such method",
    409: "the request clashes with the state (lease_lost: the lease ended)",
    413: "the body is over the size limit",
    422: "a field is invalid; ``field`` names it",
    500: "a bug in the server (internal_error: the exception's type; the server logs the rest)",
    429: "too many requests of this kind from this token (see Retry-After)",
    503: "the database cannot be reached now (database_unavailable; see Retry-After)",
}

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


def build_services(settings: Settings, clock: Clock = utc_now) -> Services:
    """Engines, database, queue, searches and protocol for ``settings``."""
    writes = make_engine(settings.db_url)
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
    misses = Misses(db, MissPolicy(settings.miss_queue_threshold, settings.miss_trials))
    tokens = Tokens(db)
    metrics = ServiceMetrics(db, online_s=settings.lease_s)
    if settings.admin_token is not None and settings.admin_token.get_secret_value():
        tokens.bootstrap(settings.admin_token.get_secret_value())
    return Services(
        settings,
        db,
        queue,
        WorkerProtocol(db, queue, SearchHost(), metrics, settings.workers_create_chips),
        Reads.of(db, settings.index_check_s, settings.lookup_cache_s, metrics),
        misses,
        tokens,
        RateLimiter(settings.miss_reports_per_s, settings.miss_report_burst),
        metrics,
    )


def create_app(settings: Settings | None = None, clock: Clock = utc_now, reaper: bool = True) -> FastAPI:
    """The tiletune API for ``settings`` (default: from the environment); see the module docstring."""
    services = build_services(settings or Settings(), clock)

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

    app = FastAPI(
        title="tiletune",
        version="1",
        summary="Tiling autotuning service: sweeps, jobs, worker leases and best configs.",
        lifespan=lifespan,
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
    app.add_exception_handler(ServiceError, _service_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _internal_error)
    for database_fault in (OperationalError, InterfaceError, DisconnectionError, PoolTimeoutError):
        app.add_exception_handler(database_fault, _database_error)
    app.add_middleware(BodyLimit, max_bytes=services.settings.max_body_bytes)
    app.add_middleware(RequestTimer, metrics=services.metrics)
    return app


def _load_index(services: Services) -> None:
    """Load the index of best configs before serving (a database away now: the first lookup will)."""
    try:
        services.reads.index.refresh()
    except Exception:
        log.exception("loading the index of best configs failed; lookups will try again")


def _reap_forever(services: Services, stop: threading.Event) -> None:
    while not stop.wait(services.settings.reap_interval_s):
        try:
            reaped = services.protocol.reap()
        except Exception:
            log.exception("reaping expired leases failed; trying again")
            continue
        if reaped:
            log.info("returned %d job(s) of expired leases to the queue", reaped)


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
    headers = {"WWW-Authenticate": "Bearer"} if isinstance(error, UnauthorizedError) else None
    if isinstance(error, RateLimitedError | UnavailableError):
        headers = {"Retry-After": str(max(1, math.ceil(error.retry_after_s)))}
    return _error(request, body, error.status, headers)


async def _internal_error(request: Request, error: Exception) -> Response:
    """A bug: 500 ``internal_error`` naming the exception's type (never its text: it may hold data)."""
    where = f"{request.method} {request.url.path}"
    message = f"internal error ({type(error).__name__}) in {where}; see the server's log"
    return JSONResponse(ErrorBody(code="internal_error", message=message).model_dump(), status_code=500)


async def _database_error(request: Request, error: Exception) -> Response:
    """A database that went away (connection refused or dropped, pool exhausted, SQLite locked): 503.

    Only connection-level faults come here: an integrity or programming error is a bug (500).
    The message names no URL or credential; the pool's pre-ping replaces dead connections.
    """
    log.warning("database unavailable for %s %s: %s", request.method, request.url.path, type(error).__name__)
    unavailable = UnavailableError("the database cannot be reached now; try again", DATABASE_RETRY_AFTER_S)
    return await _service_error(request, unavailable)


async def _validation_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, RequestValidationError)
    first = error.errors()[0] if error.errors() else {"loc": (), "msg": "invalid request"}
    field = field_path(first.get("loc", ()))
    message = f"{field}: {first.get('msg')}" if field else str(first.get("msg"))
    return _error(request, ErrorBody(code="invalid", message=message, field=field), 422)


#: Codes of the errors the framework raises itself (an unknown route, a method it has not).
HTTP_CODES = {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 413: "too_large"}


async def _http_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, StarletteHTTPException)
    code = HTTP_CODES.get(error.status_code, "http_error")
    body = ErrorBody(code=code, message=str(error.detail))
    return _error(request, body, error.status_code, error.headers)


def field_path(location: Sequence[int | str]) -> str | None:
    """A validation error's location as one path: ``("body", "shapes", 0, "n")`` -> ``shapes[0].n``."""
    path = ""
    for part in location:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part not in ("body", "query", "path", "header"):
            path += f".{part}" if path else part
    return path or None


class BodyLimit:
    """Pure ASGI middleware: a request body over ``max_bytes`` gets 413 ``too_large``, counted as received.

    A declared ``Content-Length`` over the limit is refused at once; any other body (chunked
    too) is read up to the limit before the app sees it, then handed on whole. Requests
    without a body (the lookups) pass straight through. (A pure ASGI class rather than
    ``@app.middleware("http")``, whose per-request cost is a large part of a lookup's.)
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        length = headers.get(b"content-length", b"")
        if length.isdigit() and int(length) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        if not length.strip(b"0") and b"chunked" not in headers.get(b"transfer-encoding", b"").lower():
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        received = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                await self.app(scope, receive, send)
                return
            chunk = message.get("body", b"")
            received += len(chunk)
            if received > self.max_bytes:
                await self._refuse(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        whole: Message = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return whole

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = ErrorBody(code="too_large", message=f"request body over {self.max_bytes} bytes")
        await JSONResponse(body.model_dump(), status_code=413)(scope, receive, send)
