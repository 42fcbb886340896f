"""Best configs: single-key lookup, bulk export / import, per-shape history; health and metrics."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy import text

from tiletune.client.wire import ConfigBundle, HistoryPoint, LookupPublic
from tiletune.service import configs
from tiletune.service.database import Database
from tiletune.service.dependencies import AdminDep, DatabaseDep, ReaderDep, reads_of
from tiletune.service.errors import UnavailableError
from tiletune.service.exports import accepts_gzip, not_modified
from tiletune.service.specs import parse_key

router = APIRouter(tags=["configs"])

ShapeQuery = Annotated[str, Query(description="dims as name=value pairs, e.g. m=64,n=64,k=64")]
Match = Annotated[str, Query(description="loosest answer accepted: exact | nearest | default")]

#: Seconds a readiness probe waits for the database's ``SELECT 1`` (probes time out at 4 s).
READY_TIMEOUT_S = 2.0
#: What a 503 of a probe that timed out asks callers to wait.
READY_RETRY_AFTER_S = 2.0


@router.get("/v1/configs/{kernel}", response_model=LookupPublic)
async def lookup_config(
    kernel: str,
    request: Request,
    *,
    shape: ShapeQuery,
    chip: str,
    _reader: ReaderDep,
    dtype: str = "float32",
    match: Match = "default",
) -> Response:
    """The config for one key: ``exact``, else the ``nearest`` tuned shape, else the ``default``.

    Exact hits come from the replica's index of best configs (current with this replica's
    changes at once, with other replicas' within ``2 * index_check_s``); other answers are
    cached by the replica for ``lookup_cache_s`` (see ``Settings``).
    """
    body = await reads_of(request).lookup(kernel, shape, dtype=dtype, chip=chip, match=match)
    return Response(body, media_type="application/json")


@router.get(
    "/v1/configs",
    response_model=ConfigBundle,
    responses={304: {"description": "the bundle is the one ``If-None-Match`` names (no body)"}},
)
async def export_configs(
    request: Request, chip: str, _reader: ReaderDep, kernel: str | None = None
) -> Response:
    """Every best config of a chip (optionally one kernel): the client's prefetch and the export bundle.

    The bundle carries the info of every registered kernel (or of ``kernel``
    alone; none when it is not registered), so a client can pick the nearest
    tuned shape without the kernels' code. Served from a body cached per change of the
    bundle (gzip-compressed when the request accepts gzip) with a strong ``ETag``; a request
    whose ``If-None-Match`` names it gets ``304 Not Modified``. ``exported_at`` is when this
    replica built the bundle's current content.
    """
    export = await reads_of(request).exports.get(chip, kernel)
    gzipped = accepts_gzip(request.headers.get("accept-encoding", ""))
    headers = {"ETag": export.etag(gzipped), "Vary": "Accept-Encoding", "Cache-Control": "no-cache"}
    if not_modified(request.headers.get("if-none-match"), export):
        return Response(status_code=304, headers=headers)
    if gzipped:
        headers["Content-Encoding"] = "gzip"
    body = export.gzipped if gzipped else export.body
    return Response(body, media_type="application/json", headers=headers)


@router.post("/v1/configs/import")
def import_configs(
    bundle: ConfigBundle,
    db: DatabaseDep,
    _admin: AdminDep,
    force: Annotated[bool, Query(description="also replace bests measured on this server")] = False,
) -> dict[str, int]:
    """Store an exported bundle (admins): every entry checked against its kernel and chip (its config
    and default config valid there, its software as a worker registers it), then its checksum; a
    refusal names the entry's field (``configs[3].software``) and changes nothing.

    An entry replaces a key's best only if the key has none or it is faster, and a best measured
    on this server only with ``force``.
    """
    with db.write() as session:
        changed = configs.import_configs(session, bundle, db.clock(), force)
    return {"changed": changed}


@router.get("/v1/history/{kernel}")
def history(
    kernel: str,
    shape: ShapeQuery,
    db: DatabaseDep,
    _reader: ReaderDep,
    dtype: str = "float32",
    chip: str | None = None,
) -> list[HistoryPoint]:
    """Every promotion of one shape's best config, oldest first."""
    spec, parsed = parse_key(kernel, shape, dtype)
    with db.read() as session:
        return configs.history(session, spec.name, spec.canonical_shape(parsed), dtype, chip)


@router.get("/livez")
def livez() -> dict[str, str]:
    """``ok`` while the process serves (a liveness probe that does not depend on the database)."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> dict[str, str]:
    """``ok`` when the database answers ``SELECT 1`` within 2 s (a readiness probe); else 503
    ``database_unavailable`` with ``Retry-After``. Reads no table: cheap at any size."""
    await _ping_of(request).wait(READY_TIMEOUT_S)
    return {"status": "ok"}


@router.get("/healthz")
async def healthz(request: Request) -> dict[str, str]:
    """The same as ``/readyz`` (kept for probes and scripts written before it)."""
    await _ping_of(request).wait(READY_TIMEOUT_S)
    return {"status": "ok"}


@router.get("/metrics", response_class=PlainTextResponse)
def metrics(request: Request, _reader: ReaderDep) -> Response:
    """The service's metrics in Prometheus' text format (see :mod:`tiletune.service.metrics`)."""
    body = request.app.state.services.metrics.exposition()
    return Response(body, media_type=CONTENT_TYPE_LATEST)


class DatabasePing:
    """``SELECT 1`` on the app's read pool with at most one in flight: concurrent probes await the
    same one, so a database that hangs holds one worker thread, never one per probe."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._in_flight: asyncio.Future[None] | None = None

    async def wait(self, timeout_s: float) -> None:
        """Return when the database answered; its error as raised (the app answers 503), or
        :class:`UnavailableError` after ``timeout_s`` (the ping goes on; the next probe awaits it)."""
        ping = self._in_flight
        if ping is None or ping.done() or ping.get_loop() is not asyncio.get_running_loop():
            ping = self._in_flight = asyncio.ensure_future(run_in_threadpool(self._select_one))
            ping.add_done_callback(_retrieve_error)
        try:
            await asyncio.wait_for(asyncio.shield(ping), timeout_s)
        except TimeoutError:
            message = f"the database did not answer within {timeout_s:g} s; try again"
            raise UnavailableError(message, READY_RETRY_AFTER_S) from None

    def _select_one(self) -> None:
        with self.db.read() as session:
            session.execute(text("SELECT 1"))


def _retrieve_error(future: asyncio.Future[None]) -> None:
    """Mark a ping's error as seen (a probe that timed out never awaited it)."""
    if not future.cancelled():
        future.exception()


def _ping_of(request: Request) -> DatabasePing:
    """The app's :class:`DatabasePing`, made at its first probe (one per app, on its event loop)."""
    ping: DatabasePing | None = getattr(request.app.state, "database_ping", None)
    if ping is None:
        ping = request.app.state.database_ping = DatabasePing(request.app.state.services.db)
    return ping
