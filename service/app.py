"""The FastAPI application factory: ``create_app(settings)``.

Builds the engine, store, queue, searches and worker protocol for the given
settings (nothing at import time), mounts the ``/v1`` routers, turns every
:class:`~tiletune.service.errors.ServiceError` and validation error into a
JSON ``ErrorBody`` (validation errors name the field), refuses bodies over
``max_body_bytes`` (413), and, while serving, returns the jobs of expired
leases to the queue every ``reap_interval_s``.

The schema is not created here: ``tiletune server`` runs the migrations
first (:func:`tiletune.service.migrate.upgrade`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from tiletune.client.wire import ErrorBody
from tiletune.service import api_configs, api_sweeps, api_workers
from tiletune.service.database import is_sqlite, make_engine, make_sessions
from tiletune.service.errors import ServiceError
from tiletune.service.queue import JobQueue, LeaseSettings
from tiletune.service.settings import Settings
from tiletune.service.store import Clock, Store, utc_now
from tiletune.service.studies import StudyHost, make_storage, optuna_storage_url
from tiletune.service.tuning import Tuning

log = logging.getLogger(__name__)


@dataclass
class Services:
    """What the routes use, built once per app (``app.state.services``)."""

    settings: Settings
    store: Store
    queue: JobQueue
    tuning: Tuning


def build_services(settings: Settings, clock: Clock = utc_now) -> Services:
    """Engine, store, queue, searches and protocol for ``settings``."""
    store = Store(make_sessions(make_engine(settings.db_url)), clock)
    queue = JobQueue(
        store,
        LeaseSettings(settings.lease_s, settings.heartbeat_s, settings.max_lease_failures),
    )
    optuna_url = optuna_storage_url(settings.db_url, settings.optuna_url)
    studies = StudyHost(make_storage(optuna_url), shared=not is_sqlite(settings.db_url))
    return Services(settings, store, queue, Tuning(store, queue, studies))


def create_app(settings: Settings | None = None, clock: Clock = utc_now, reaper: bool = True) -> FastAPI:
    """The tiletune API for ``settings`` (default: from the environment); see the module docstring."""
    services = build_services(settings or Settings(), clock)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        stop = threading.Event()
        thread = None
        if reaper:
            thread = threading.Thread(target=_reap_forever, args=(services, stop), daemon=True, name="reaper")
            thread.start()
        yield
        stop.set()
        if thread is not None:
            thread.join(timeout=5)

    app = FastAPI(
        title="tiletune",
        version="1",
        summary="Tiling autotuning service: sweeps, jobs, worker leases and best configs.",
        lifespan=lifespan,
    )
    app.state.services = services
    for router in (api_sweeps.router, api_workers.router, api_configs.router):
        app.include_router(router)
    app.add_exception_handler(ServiceError, _service_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.middleware("http")(_body_limit(services.settings.max_body_bytes))
    return app


def _reap_forever(services: Services, stop: threading.Event) -> None:
    while not stop.wait(services.settings.reap_interval_s):
        try:
            reaped = services.tuning.reap()
        except Exception:
            log.exception("reaping expired leases failed; trying again")
            continue
        if reaped:
            log.info("returned %d job(s) of expired leases to the queue", reaped)


async def _service_error(_request: Request, error: Exception) -> Response:
    assert isinstance(error, ServiceError)
    body = ErrorBody(code=error.code, message=error.message, field=error.field)
    return JSONResponse(body.model_dump(), status_code=error.status)


async def _validation_error(_request: Request, error: Exception) -> Response:
    assert isinstance(error, RequestValidationError)
    first = error.errors()[0] if error.errors() else {"loc": (), "msg": "invalid request"}
    field = field_path(first.get("loc", ()))
    message = f"{field}: {first.get('msg')}" if field else str(first.get("msg"))
    body = ErrorBody(code="invalid", message=message, field=field)
    return JSONResponse(body.model_dump(), status_code=422)


def field_path(location: Sequence[int | str]) -> str | None:
    """A validation error's location as one path: ``("body", "shapes", 0, "n")`` -> ``shapes[0].n``."""
    path = ""
    for part in location:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part not in ("body", "query", "path", "header"):
            path += f".{part}" if path else part
    return path or None


def _body_limit(
    max_bytes: int,
) -> Callable[[Request, Callable[[Request], Awaitable[Response]]], Awaitable[Response]]:
    async def limit(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > max_bytes:
            body = ErrorBody(code="too_large", message=f"request body over {max_bytes} bytes", field=None)
            return JSONResponse(body.model_dump(), status_code=413)
        return await call_next(request)

    return limit
