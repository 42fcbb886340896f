"""A request id on every request, in its answer and in every log line logged while handling it.

:class:`RequestIds` (pure ASGI middleware, outermost of the app's own) gives each HTTP request
an id: the caller's ``X-Request-ID`` when it is sane (1 to :data:`MAX_REQUEST_ID_CHARS`
characters of ``A-Z a-z 0-9 . _ -``), else a new one (32 hex digits, a random UUID). The id is

- echoed in the answer's ``X-Request-ID`` header (replacing any the app set);
- the value of :data:`current_request_id` while the request is handled: in the event loop's
  task and in the worker threads of sync endpoints (they run in a copy of the task's context),
  so :class:`RequestIdFilter`, on the log handler, stamps ``record.request_id`` on every line
  logged meanwhile. When the app raises, the id stays set in the request's task (each request
  runs in a task of its own under uvicorn), so the server's report of the error carries it;
- in the request's access line, written here on the ``tiletune.access`` logger (INFO) once the
  answer is sent: ``CLIENT - "METHOD PATH" STATUS DURATION ms``, with the same values as the
  record's attributes :data:`ACCESS_FIELDS` (the JSON format writes them as fields). The path
  is written without its query string, percent-encoded, each segment that may be a secret
  replaced (:func:`logged_path`); no header is ever logged. A request whose client went away
  before its answer is status 499 (:class:`RequestOutcome`), never a 500.

Messages pass through unchanged, one at a time: streamed answers and the body limits of
:mod:`tiletune.service.access.bodies` work as without it.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from contextvars import ContextVar
from typing import TYPE_CHECKING
from urllib.parse import quote

from tiletune.client.wire import REQUEST_ID_HEADER

if TYPE_CHECKING:  # no Starlette at run time: the command line's logs import this on the base install
    from starlette.types import ASGIApp, Message, Receive, Scope, Send
MAX_REQUEST_ID_CHARS = 128
ACCESS_LOGGER = "tiletune.access"
#: The status of a request whose client went away before its answer (nginx's).
CLIENT_CLOSED = 499
#: What an access line's record carries besides its message (and ``request_id``).
ACCESS_FIELDS = ("method", "path", "status", "duration_ms", "client")

_SANE_ID = re.compile(rf"[A-Za-z0-9._-]{{1,{MAX_REQUEST_ID_CHARS}}}")
_HEADER_KEY = REQUEST_ID_HEADER.lower().encode("latin-1")
#: The characters of a path written as they are (others are percent-encoded: no line breaks).
_PATH_SAFE = "/:@!$&'()*+,;=-._~"
#: A path segment that may be a secret, logged as :data:`REDACTED`: a token (``tt_...``), or 20 or
#: more URL-safe characters with an upper-case letter (a lease token, as earlier workers put it in
#: their paths: ``/v1/leases/TOKEN/heartbeat``; the API's own segments are lower-case).
_SECRET_SEGMENT = re.compile(r"tt_.*|(?=.{20,})(?=.*[A-Z])[A-Za-z0-9_-]+")
REDACTED = "REDACTED"

#: The id of the request being handled in this context (``None`` outside a request).
current_request_id: ContextVar[str | None] = ContextVar("tiletune_request_id", default=None)

access_log = logging.getLogger(ACCESS_LOGGER)


def new_request_id() -> str:
    """A fresh request id: a random UUID's 32 hex digits."""
    return uuid.uuid4().hex


def request_id_of(given: str | None) -> str:
    """``given`` when it is a sane request id (see the module docstring), else a fresh one."""
    if given is not None and _SANE_ID.fullmatch(given):
        return given
    return new_request_id()


class RequestIdFilter(logging.Filter):
    """Stamps ``record.request_id``: the request being handled when the record was logged, or None.

    On a handler, it sees every record that reaches that handler, whatever its logger; a record
    that already carries a ``request_id`` keeps it.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            record.request_id = current_request_id.get()
        return True


class RequestOutcome:
    """What became of one request, as a middleware sees it: pass :meth:`receive` on as the app's
    ``receive``, show :meth:`saw` each message sent (and call :meth:`went_away` when cancelled),
    then read :attr:`status`: the answer's, :data:`CLIENT_CLOSED` when the client went away before
    an answer or before anything but a 500 (reading a body that never came), else 500."""

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self.answered: int | None = None
        self.disconnected = False

    async def receive(self) -> Message:
        message = await self._receive()
        if message["type"] == "http.disconnect":
            self.disconnected = True
        return message

    def saw(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.answered = int(message["status"])

    def went_away(self) -> None:
        self.disconnected = True

    @property
    def status(self) -> int:
        if self.disconnected and (self.answered is None or self.answered >= 500):
            return CLIENT_CLOSED
        return self.answered if self.answered is not None else 500


class RequestIds:
    """Pure ASGI middleware: the request id and the access line (see the module docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = request_id_of(_header(scope, _HEADER_KEY))
        token = current_request_id.set(request_id)
        started = time.perf_counter()
        outcome = RequestOutcome(receive)

        async def send_with_id(message: Message) -> None:
            outcome.saw(message)
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", ()) if k.lower() != _HEADER_KEY]
                headers.append((_HEADER_KEY, request_id.encode("latin-1")))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, outcome.receive, send_with_id)
        except asyncio.CancelledError:
            outcome.went_away()
            raise
        finally:
            _log_access(scope, outcome.status, (time.perf_counter() - started) * 1000.0)
        current_request_id.reset(token)  # only after a normal end (see the module docstring)


def _header(scope: Scope, key: bytes) -> str | None:
    """The first value of header ``key`` (lower case) in the request, or None."""
    for name, value in scope.get("headers", ()):
        if name.lower() == key:
            return bytes(value).decode("latin-1")
    return None


def logged_path(path: str) -> str:
    """``path`` with each segment that may be a secret replaced by :data:`REDACTED`."""
    return "/".join(REDACTED if _SECRET_SEGMENT.fullmatch(part) else part for part in path.split("/"))


def _log_access(scope: Scope, status: int, duration_ms: float) -> None:
    """The request's access line (see the module docstring)."""
    if not access_log.isEnabledFor(logging.INFO):
        return
    client = scope.get("client")
    address = f"{client[0]}:{client[1]}" if client else "-"
    path = quote(logged_path(scope.get("path", "")), safe=_PATH_SAFE)
    method = str(scope.get("method", ""))
    fields = {
        "method": method,
        "path": path,
        "status": status,
        "duration_ms": round(duration_ms, 1),
        "client": address,
    }
    access_log.info('%s - "%s %s" %d %.1f ms', address, method, path, status, duration_ms, extra=fields)
