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
  is sent without its query string, percent-encoded; no header is ever logged.

Messages pass through unchanged, one at a time: streamed answers and the body limits of
:mod:`tiletune.service.bodies` work as without it.
"""

from __future__ import annotations

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
#: What an access line's record carries besides its message (and ``request_id``).
ACCESS_FIELDS = ("method", "path", "status", "duration_ms", "client")

_SANE_ID = re.compile(rf"[A-Za-z0-9._-]{{1,{MAX_REQUEST_ID_CHARS}}}")
_HEADER_KEY = REQUEST_ID_HEADER.lower().encode("latin-1")
#: The characters of a path written as they are (others are percent-encoded: no line breaks).
_PATH_SAFE = "/:@!$&'()*+,;=-._~"

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
        status = 500  # unless an answer starts: the app raised before answering

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                headers = [(k, v) for k, v in message.get("headers", ()) if k.lower() != _HEADER_KEY]
                headers.append((_HEADER_KEY, request_id.encode("latin-1")))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            _log_access(scope, status, (time.perf_counter() - started) * 1000.0)
        current_request_id.reset(token)  # only after a normal end (see the module docstring)


def _header(scope: Scope, key: bytes) -> str | None:
    """The first value of header ``key`` (lower case) in the request, or None."""
    for name, value in scope.get("headers", ()):
        if name.lower() == key:
            return bytes(value).decode("latin-1")
    return None


def _log_access(scope: Scope, status: int, duration_ms: float) -> None:
    """The request's access line (see the module docstring)."""
    if not access_log.isEnabledFor(logging.INFO):
        return
    client = scope.get("client")
    address = f"{client[0]}:{client[1]}" if client else "-"
    path = quote(scope.get("path", ""), safe=_PATH_SAFE)
    method = str(scope.get("method", ""))
    fields = {
        "method": method,
        "path": path,
        "status": status,
        "duration_ms": round(duration_ms, 1),
        "client": address,
    }
    access_log.info('%s - "%s %s" %d %.1f ms', address, method, path, status, duration_ms, extra=fields)
