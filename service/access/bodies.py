"""Request bodies: a size cap per route, a deadline to arrive, and JSON checked off the event loop.

Every request that carries a body passes :class:`BodyGuard` (pure ASGI middleware) before the app:

- **size**: a body over its route's cap (:data:`ROUTE_BODIES`; never over the server's ceiling
  ``TILETUNE_MAX_BODY_BYTES``) gets 413 ``too_large`` naming the cap: at once when
  ``Content-Length`` says so, else as soon as the bytes read pass it. A route's cap is the
  smallest power of two of at least 1.25 times the largest body its wire model accepts, in
  compact JSON with every text at its length limit in 4-byte characters (measured by
  ``tests/service/test_bodies.py``); where that is over the ceiling, the ceiling. Routes not in
  the table (reads, and calls such as ``heartbeat`` that take no body) take
  :data:`NO_BODY_BYTES`.
- **time**: the whole body must arrive within ``TILETUNE_BODY_TIMEOUT_S`` of the request's head;
  a client that trickles or stalls gets 408 ``body_timeout`` and its connection is closed.
- **who**: a JSON body over :data:`SMALL_BODY_BYTES` is taken only from a caller whose token
  may call the route (else 401, 403 or 429, the body dropped unparsed), so a large body is
  never parsed for a caller the route would refuse.
- **structure**: such a body is then checked in a worker thread (at most
  :data:`MAX_CHECKS_AT_ONCE` at a time), so the event loop keeps serving
  (:mod:`tiletune.service.access.body_json`): first its structure, scanned before anything is built
  from it (at most ``MAX_DEPTH`` levels, ``MAX_KEYS`` keys per object, ``MAX_ELEMENTS``
  elements per array, and the route's most values; 413 ``too_large`` naming the limit and the
  byte where it was passed); then it is parsed and validated against the route's model, lists
  item by item, so that no single step holds the interpreter long nor builds more than one
  item's errors (422 ``invalid`` naming the first field at fault). A body that passes goes on
  to the app unchanged (which parses it again, and validates it as its route does).
- Bodies up to :data:`SMALL_BODY_BYTES` go on to the app once read: the most errors such a
  body can make (about 1,400 unknown keys) cost the event loop a few milliseconds.
- A refused body within the ceiling is read to its end and dropped (never kept) before the
  answer, so that a client still sending reads the answer rather than a reset connection;
  every refusal closes the connection.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio
import anyio.to_thread
from pydantic import BaseModel
from starlette.responses import JSONResponse
from starlette.routing import compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tiletune.client.wire import (
    ClientStatsCreate,
    CompleteCreate,
    ConfigBundle,
    LeaseCreate,
    MissesCreate,
    ReleaseCreate,
    Role,
    SweepCreate,
    TellCreate,
    TokenCreate,
    WorkerCreate,
)
from tiletune.service.access.auth import Identity, require
from tiletune.service.access.body_json import BodyRefusedError, check_json, too_large
from tiletune.service.dashboard.session import MAX_FORM_BYTES
from tiletune.service.errors import ServiceError, UnauthorizedError

KIB = 1024
#: JSON bodies up to this size go on to the app once read; larger ones are checked first.
SMALL_BODY_BYTES = 8 * KIB
#: The cap of a route not in :data:`ROUTE_BODIES` (reads, and calls that take no body).
NO_BODY_BYTES = 1 * KIB
#: Large bodies checked at once (each in a worker thread); others wait their turn.
MAX_CHECKS_AT_ONCE = 2


@dataclass(frozen=True)
class RouteBody:
    """What a route takes: a body of at most ``max_bytes`` (``None``: the server's ceiling).

    ``model``: the JSON body's model (``None``: a form, or no JSON); ``role``: who may send a
    body over :data:`SMALL_BODY_BYTES` (``reader``: any valid token); ``max_values``: the most
    JSON values (scalars, arrays and objects) a body may hold (``None``: as its bytes allow).
    """

    max_bytes: int | None
    model: type[BaseModel] | None = None
    role: Role | None = None
    max_values: int | None = None

    def cap(self, ceiling_bytes: int) -> int:
        """The route's cap under the server's ceiling."""
        return ceiling_bytes if self.max_bytes is None else min(self.max_bytes, ceiling_bytes)


_TELL = RouteBody(None, TellCreate, Role.WORKER, max_values=12_000)  # 11,002 values, 15.5 MiB: the ceiling
_COMPLETE = RouteBody(1024 * KIB, CompleteCreate, Role.WORKER)  # 675 KiB at most
_RELEASE = RouteBody(16 * KIB, ReleaseCreate, Role.WORKER)  # 7.8 KiB at most
_FORM = RouteBody(MAX_FORM_BYTES)

#: Each route that takes a body ("METHOD /path/template") and what it takes; the largest legal
#: body of each is in the comment (see the module docstring for how it is measured).
ROUTE_BODIES: dict[str, RouteBody] = {
    # 10,000 jobs at most (TILETUNE_MAX_JOBS_PER_SWEEP), 65,000 shapes of 16 dims legal: the ceiling
    "POST /v1/sweeps": RouteBody(None, SweepCreate, Role.SUBMITTER),
    "POST /v1/workers": RouteBody(64 * KIB, WorkerCreate, Role.WORKER),  # 40 KiB at most
    "POST /v1/leases": RouteBody(1 * KIB, LeaseCreate, Role.WORKER),  # 33 bytes at most
    "POST /v1/lease/tell": _TELL,
    "POST /v1/lease/complete": _COMPLETE,
    "POST /v1/lease/release": _RELEASE,
    "POST /v1/configs/import": RouteBody(None, ConfigBundle, Role.ADMIN),  # as many configs as fit
    # 230,002 values, 21.5 MiB at most: the ceiling
    "POST /v1/misses": RouteBody(None, MissesCreate, Role.READER, max_values=250_000),
    # 145 KiB at most (100 keys of 16 dims)
    "POST /v1/client-stats": RouteBody(256 * KIB, ClientStatsCreate, Role.READER),
    "POST /v1/tokens": RouteBody(2 * KIB, TokenCreate, Role.ADMIN),  # 1,637 bytes at most
    "POST /signin": _FORM,
    "POST /signout": _FORM,
    "POST /misses/queue": _FORM,
}

_NO_BODY = RouteBody(NO_BODY_BYTES)
_ROUTES = [
    (key.split(" ", 1)[0], compile_path(key.split(" ", 1)[1])[0], body) for key, body in ROUTE_BODIES.items()
]


def route_body(method: str, path: str) -> RouteBody:
    """What the route of ``method`` and ``path`` takes (:data:`NO_BODY_BYTES` for any other)."""
    for route_method, pattern, body in _ROUTES:
        if route_method == method and pattern.match(path):
            return body
    return _NO_BODY


# -- the middleware ----------------------------------------------------------------------------------

#: Verifies a presented token (``secret``, from the client ``address``): its identity, else a
#: :class:`ServiceError` (401 unknown or revoked, 429 too many failures from the address).
Authenticate = Callable[[str, str], Awaitable[Identity]]


@dataclass(frozen=True)
class _Incoming:
    """A request with a body, as the guard sees it before reading the body."""

    scope: Scope
    headers: dict[bytes, bytes]
    route: RouteBody
    #: ``Content-Length``, or ``None`` (chunked).
    declared: int | None
    #: A JSON body of a route with a model: a large one is checked before the app sees it.
    checked: bool

    @classmethod
    def of(cls, scope: Scope) -> _Incoming | None:
        """The request, or ``None`` when it carries no body."""
        headers = dict(scope["headers"])
        length = headers.get(b"content-length", b"").strip()
        chunked = b"chunked" in headers.get(b"transfer-encoding", b"").lower()
        if not length.strip(b"0") and not chunked:
            return None
        route = route_body(scope["method"], scope["path"])
        checked = route.model is not None and _is_json(headers.get(b"content-type", b""))
        return cls(scope, headers, route, int(length) if length.isdigit() else None, checked)

    @property
    def may_be_large(self) -> bool:
        return self.declared is None or self.declared > SMALL_BODY_BYTES

    @property
    def awaits_continue(self) -> bool:
        """The client sends the body only when told to (``Expect: 100-continue``)."""
        return self.headers.get(b"expect", b"").strip().lower() == b"100-continue"

    @property
    def address(self) -> str:
        client = self.scope.get("client")
        return str(client[0]) if client else ""

    def over(self, cap: int) -> BodyRefusedError:
        """413: the body is over ``cap``, this route's."""
        where = f"{self.scope['method']} {self.scope['path']}"
        return too_large(f"the request body is over {cap:,} bytes, the most {where} takes")


class BodyGuard:
    """Pure ASGI middleware: size, time, caller and structure of request bodies (see the module).

    ``ceiling_bytes``: the server's ceiling (``TILETUNE_MAX_BODY_BYTES``); ``timeout_s``: how long
    a body may take to arrive; ``authenticate``: an awaitable ``(secret, address) -> Identity``.
    Requests without a body (the lookups) pass straight through.

    A body declared over the ceiling, or not sent yet (``Expect: 100-continue``), is answered
    at once; any other refused body is read to its end (or the ceiling) and dropped first.
    """

    def __init__(
        self, app: ASGIApp, ceiling_bytes: int, timeout_s: float, authenticate: Authenticate
    ) -> None:
        self.app = app
        self.ceiling_bytes = ceiling_bytes
        self.timeout_s = timeout_s
        self.authenticate = authenticate
        self._checks: anyio.CapacityLimiter | None = None  # made in the event loop, on first use

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        incoming = _Incoming.of(scope) if scope["type"] == "http" else None
        if incoming is None:
            await self.app(scope, receive, send)
            return
        try:
            with anyio.fail_after(self.timeout_s):
                body = await self._read(incoming, receive)
            if incoming.checked and body is not None and len(body) > SMALL_BODY_BYTES:
                await self._check(body, incoming.route)
        except BodyRefusedError as refused:
            await _refuse(refused, scope, receive, send)
            return
        except TimeoutError:
            late = f"the request body did not arrive within {self.timeout_s:g} s"
            await _refuse(BodyRefusedError(408, "body_timeout", late, "body"), scope, receive, send)
            return
        if body is not None:  # else the client went away
            await self.app(scope, _replay(body, receive), send)

    async def _read(self, incoming: _Incoming, receive: Receive) -> bytes | None:
        """The body, read whole (``None`` if the client went away), once its size and caller passed."""
        cap = incoming.route.cap(self.ceiling_bytes)
        if incoming.declared is not None and incoming.declared > self.ceiling_bytes:
            raise incoming.over(cap)
        refusal = None
        if incoming.declared is not None and incoming.declared > cap:
            refusal = incoming.over(cap)
        elif incoming.checked and incoming.may_be_large:
            refusal = await self._refusal_of_caller(incoming)
        if refusal is not None:
            if not incoming.awaits_continue:  # else the client waits for an answer before sending
                await self._drain(receive)
            raise refusal
        chunks: list[bytes] = []
        received = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None
            chunk = message.get("body", b"")
            received += len(chunk)
            if received > cap:
                if message.get("more_body", False):
                    await self._drain(receive, received)
                raise incoming.over(cap)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _refusal_of_caller(self, incoming: _Incoming) -> BodyRefusedError | None:
        """Why the caller may not send its route a large body (401, 403, 429), or ``None``."""
        role = incoming.route.role
        assert role is not None
        scheme, _, secret = incoming.headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            needs = f"this needs a {role.value} token (Authorization: Bearer)"
            return BodyRefusedError.of(UnauthorizedError(needs, field="authorization"))
        try:
            identity = await self.authenticate(secret.strip(), incoming.address)
            require(identity, role)
        except ServiceError as error:
            return BodyRefusedError.of(error)
        return None

    async def _drain(self, receive: Receive, received: int = 0) -> None:
        """Read the rest of a refused body and drop it, until its end or the ceiling."""
        while received <= self.ceiling_bytes:
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                return
            received += len(message.get("body", b""))

    async def _check(self, body: bytes, route: RouteBody) -> None:
        if self._checks is None:
            self._checks = anyio.CapacityLimiter(MAX_CHECKS_AT_ONCE)
        assert route.model is not None
        await anyio.to_thread.run_sync(check_json, body, route.model, route.max_values, limiter=self._checks)


def _is_json(content_type: bytes) -> bool:
    """True for ``application/json`` and ``application/*+json`` (what FastAPI parses as JSON)."""
    media = content_type.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or (media.startswith(b"application/") and media.endswith(b"+json"))


async def _refuse(refused: BodyRefusedError, scope: Scope, receive: Receive, send: Send) -> None:
    """Answer the refusal and close the connection (the rest of the body is not read)."""
    headers = {**refused.headers, "Connection": "close"}
    response = JSONResponse(refused.body.model_dump(), status_code=refused.status, headers=headers)
    await response(scope, receive, send)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the app the body read, whole, then the client's messages."""
    whole: Message = {"type": "http.request", "body": body, "more_body": False}
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return whole

    return replay
