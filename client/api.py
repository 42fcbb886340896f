"""The REST client of ``/v1``: :class:`ServiceApi` (sync) and :class:`AsyncServiceApi` (asyncio).

The only code that speaks HTTP to a tiletune server: the worker, the ``tiletune`` command
and the runtime clients (:class:`~tiletune.client.sync.ConfigClient`, its async twin) all
send their calls through it. The twins have the same method names; each call is built
once in :mod:`tiletune.client.calls` and raises the errors defined there.

httpx is the transport and the seam: ``transport=`` takes the app's ASGI or WSGI transport
in tests, or ``http=`` a ready ``httpx.Client`` (Starlette's ``TestClient`` is one). The
bearer token goes in the ``Authorization`` header, never in a URL.

Bounds (every call, both twins): a call takes at most its deadline in all — connecting,
sending, waiting for the answer and reading its last byte — not per read: ``Call.timeout_s``,
else ``deadline_s`` (:data:`DEFAULT_DEADLINE_S`); and its answer's body is read, decoded, up
to ``Call.max_bytes``, else ``max_bytes`` (:data:`~tiletune.client.calls.MAX_ANSWER_BYTES`),
counted as it arrives: a gzip body is inflated step by step and the call gives up past the
cap, having held at most the cap and one step (:class:`CappedBody`). Past the deadline a call
raises :class:`ServerUnreachableError`, past the cap :class:`UnexpectedAnswerError`; no
connection is left behind. The async twin runs each exchange under ``asyncio.timeout``; the
sync twin's own transport (:class:`DeadlineTransport`, the default) cuts every socket
operation to the time left, so a server that trickles its headers a byte at a time cannot
hold a call (with a transport given, the deadline is checked as the body arrives). The
default transport goes through the HTTP proxy the environment names, as httpx would.

Retrying (sync twin): with a :class:`Retry`, a call that gets no answer or a 5xx is sent
again after a capped exponential :class:`Backoff` until it succeeds, its ``attempts`` are
spent (the last error is raised), or, for unbounded calls, the retry's ``stopping`` event is
set (:class:`StopRequestedError`). A 4xx is never retried. Without a :class:`Retry` each
call is one attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
import time
import urllib.request
import zlib
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TypeVar

import httpcore
import httpx

from tiletune.client import calls
from tiletune.client.calls import (
    MAX_ANSWER_BYTES,
    ApiError,
    Call,
    ServerRefusedError,
    ServerUnreachableError,
    UnexpectedAnswerError,
    checked,
)
from tiletune.client.wire import (
    AskPublic,
    ConfigBundle,
    LeasePublic,
    LookupPublic,
    MissesCreate,
    MissesPublic,
    SweepCreate,
    SweepPublic,
    TellPublic,
    TrialOutcome,
    ValidatedConfig,
    WorkerCreate,
    WorkerPublic,
)

log = logging.getLogger(__name__)

R = TypeVar("R")

#: Default seconds of one socket operation of a call that names no deadline (connect: at most 10 s).
DEFAULT_TIMEOUT_S = 30.0
#: Default seconds a whole call may take when it names none (the worker's and the command line's):
#: an ask the server takes seconds to answer, a sweep of 10,000 jobs, fit well within.
DEFAULT_DEADLINE_S = 120.0
#: The content codings an answer may come in (asked for in ``Accept-Encoding``; see :class:`CappedBody`).
ACCEPT_ENCODING = "gzip"
#: Decoded bytes made at most per step of :class:`CappedBody` (between steps: the deadline is checked,
#: the event loop runs).
DECODE_STEP_BYTES = 256 * 1024
#: Bytes handed to a socket per write of :class:`DeadlineTransport` (each cut to the time left).
WRITE_STEP_BYTES = 64 * 1024
#: The status of a server whose database is away for now: always retried.
SERVICE_UNAVAILABLE = 503


class StopRequestedError(Exception):
    """The caller asked to stop (``Retry.stopping``) while a call was waiting for the server."""


@dataclass(frozen=True)
class Backoff:
    """Capped exponential backoff: ``initial_s · factor^attempt``, at most ``max_s``.

    ``jitter`` shortens each delay by a random fraction up to it (never lengthens
    it), so a fleet of workers does not reconnect in lockstep after an outage.
    """

    initial_s: float = 0.5
    max_s: float = 30.0
    factor: float = 2.0
    jitter: float = 0.1

    def delay_s(self, attempt: int) -> float:
        """The delay before retry number ``attempt + 1`` (``attempt`` counts from 0)."""
        capped = min(self.max_s, self.initial_s * self.factor ** min(attempt, 64))
        return capped * (1.0 - self.jitter * random.random())


@dataclass(frozen=True)
class Retry:
    """How the sync twin retries a call that got no answer or a 5xx (see the module docstring).

    ``attempts`` ``None``: until it succeeds or ``stopping`` is set. ``sleep`` waits
    between attempts (default: an interruptible wait on ``stopping``). ``max_server_errors``:
    consecutive 5xx answers other than 503 after which a call gives up and raises the last
    :class:`ServerRefusedError` (a request the server fails on every time is no outage;
    ``None``: retry those too). A 503 (the server's database is away) and no answer at all
    are always retried.
    """

    backoff: Backoff = field(default_factory=Backoff)
    attempts: int | None = None
    max_server_errors: int | None = None
    stopping: threading.Event = field(default_factory=threading.Event)
    sleep: Callable[[float], object] | None = None

    def wait(self, seconds: float) -> None:
        """Sleep ``seconds`` (cut short by ``stopping`` with the default sleep)."""
        if self.sleep is not None:
            self.sleep(seconds)
        else:
            self.stopping.wait(seconds)


def _headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def _timeout(timeout_s: float) -> httpx.Timeout:
    return httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0))


def http_client(
    url: str,
    token: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    transport: httpx.BaseTransport | None = None,
) -> httpx.Client:
    """An ``httpx.Client`` for the server at ``url``, the bearer token in its headers; its transport
    is ``transport``, else a :class:`DeadlineTransport` (through the environment's proxy for ``url``)."""
    if transport is None:
        transport = DeadlineTransport(environment_proxy(url))
    return httpx.Client(
        base_url=url, headers=_headers(token), timeout=_timeout(timeout_s), transport=transport
    )


def _failure(url: str, call: Call[R], error: httpx.HTTPError, deadline: Deadline) -> ApiError:
    """The call's error for an httpx failure: no answer (none by the deadline), or an answer that
    cannot be read (a body that does not decode as its ``Content-Encoding`` says, too many redirects)."""
    if isinstance(error, httpx.TimeoutException) and deadline.passed():
        return ServerUnreachableError(deadline.missed(url, call))
    if isinstance(error, httpx.TransportError):
        return ServerUnreachableError(f"cannot reach the server at {url} ({type(error).__name__}: {error})")
    return UnexpectedAnswerError(
        f"{url}{call.path} answered something that cannot be read ({type(error).__name__}: {error})"
    )


# -- bounds of one exchange: its deadline, the cap on its answer ----------------------------------


@dataclass(frozen=True)
class Deadline:
    """When an exchange must be over (``time.monotonic()``), and the seconds it was given."""

    at: float
    seconds: float

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(time.monotonic() + seconds, seconds)

    def left_s(self) -> float:
        return self.at - time.monotonic()

    def passed(self) -> bool:
        return self.left_s() <= 0

    def check(self) -> None:
        """Raise ``httpx.ReadTimeout`` once the deadline has passed."""
        if self.passed():
            raise httpx.ReadTimeout(f"no complete answer within {self.seconds:g} s")

    def missed(self, url: str, call: Call[Any]) -> str:
        """The message of a call that ran out of time."""
        return f"no complete answer from {url}{call.path} within {self.seconds:g} s (its deadline)"

    @contextlib.contextmanager
    def on_this_thread(self) -> Iterator[None]:
        """Make this the deadline of the calling thread's socket operations (:class:`DeadlineTransport`)."""
        before, _THREAD_DEADLINE.at = _THREAD_DEADLINE.at, self.at
        try:
            yield
        finally:
            _THREAD_DEADLINE.at = before


class _ThreadDeadline(threading.local):
    """The deadline (``time.monotonic()``) of the exchange a thread is making; ``None`` between."""

    at: float | None = None


_THREAD_DEADLINE = _ThreadDeadline()


def _cut(timeout: float | None, expired: type[httpcore.TimeoutException]) -> float | None:
    """The timeout of one socket operation, cut to the time left before its thread's deadline;
    ``expired`` once it has passed."""
    at = _THREAD_DEADLINE.at
    if at is None:
        return timeout
    left = at - time.monotonic()
    if left <= 0:
        raise expired("the call's deadline passed")
    return left if timeout is None else min(timeout, left)


class CappedBody:
    """An answer's body as it arrives, decoded as its ``Content-Encoding`` says, at most ``max_bytes``.

    :meth:`feed` decodes each chunk read off the wire in steps of at most ``DECODE_STEP_BYTES``,
    yielding after each; past ``max_bytes`` it raises :class:`UnexpectedAnswerError` at once, having
    held at most ``max_bytes`` and one step. Content codings: none, ``identity``, ``gzip``; another
    (one the client did not ask for) is ``httpx.DecodingError``, as is a body that does not inflate.
    """

    def __init__(self, response: httpx.Response, max_bytes: int, where: str) -> None:
        read = response.is_stream_consumed  # a transport that read (and decoded) the body: a test's
        self._inflate = None if read else _inflater(response.headers.get("content-encoding", ""))
        self._max_bytes = max_bytes
        self._where = where
        self._parts: list[bytes] = []
        self._size = 0

    def feed(self, raw: bytes) -> Iterator[None]:
        """Take one chunk as read; yields after each step of decoding."""
        if self._inflate is None:
            self._keep(raw)
            yield
            return
        data = raw
        while not self._inflate.eof:
            limit = min(self._max_bytes - self._size + 1, DECODE_STEP_BYTES)
            try:
                out = self._inflate.decompress(data, limit)
            except zlib.error as error:
                raise httpx.DecodingError(f"the gzip body does not inflate ({error})") from None
            self._keep(out)
            data = self._inflate.unconsumed_tail
            yield
            if not data and len(out) < limit:  # this chunk is decoded, nothing is pending
                return

    def content(self) -> bytes:
        """The body decoded, once the last chunk was fed."""
        if self._inflate is not None:
            try:
                self._keep(self._inflate.flush())
            except zlib.error as error:
                raise httpx.DecodingError(f"the gzip body does not inflate ({error})") from None
        return b"".join(self._parts)

    def _keep(self, data: bytes) -> None:
        self._size += len(data)
        if self._size > self._max_bytes:
            self._parts.clear()
            raise UnexpectedAnswerError(
                f"{self._where} answered more than {self._max_bytes} bytes; the answer was not read further"
            )
        if data:
            self._parts.append(data)


def _inflater(content_encoding: str) -> zlib._Decompress | None:
    """A zlib decompressor of ``content_encoding``; ``None`` for none; ``httpx.DecodingError`` for one
    this client does not read."""
    named = (coding.strip().lower() for coding in content_encoding.split(","))
    codings = [coding for coding in named if coding not in ("", "identity")]
    if not codings:
        return None
    if codings in (["gzip"], ["x-gzip"]):
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    raise httpx.DecodingError(f"an answer in the content coding {content_encoding[:100]!r}, not asked for")


def _raw_chunks(response: httpx.Response) -> Iterator[bytes]:
    """The body as it arrives (as the transport gave it, when it read the body itself)."""
    if response.is_stream_consumed:
        yield response.content
    else:
        yield from response.iter_raw()


async def _async_raw_chunks(response: httpx.Response) -> AsyncIterator[bytes]:
    """:func:`_raw_chunks` of an async answer."""
    if response.is_stream_consumed:
        yield response.content
    else:
        async for raw in response.aiter_raw():
            yield raw


#: The headers of a body as sent, dropped from the answer once its body is decoded.
_WIRE_HEADERS = ("content-encoding", "content-length", "transfer-encoding")


def _answered(response: httpx.Response, content: bytes) -> httpx.Response:
    """``response`` with its body read and decoded (what the calls' decoders take)."""
    headers = [(k, v) for k, v in response.headers.multi_items() if k.lower() not in _WIRE_HEADERS]
    return httpx.Response(response.status_code, headers=headers, content=content, request=response.request)


# -- the sync twin's transport: every socket operation cut to the call's deadline -----------------


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose every operation waits at most until its thread's deadline (:func:`_cut`)."""

    def __init__(self, stream: httpcore.NetworkStream) -> None:
        self._stream = stream

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, _cut(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        for start in range(0, len(buffer), WRITE_STEP_BYTES):
            step = buffer[start : start + WRITE_STEP_BYTES]
            self._stream.write(step, _cut(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        timeout = _cut(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._stream.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's sync sockets, as :class:`_DeadlineStream`."""

    def __init__(self) -> None:
        self._backend = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        timeout = _cut(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._backend.connect_tcp(host, port, timeout, local_address, socket_options))

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        timeout = _cut(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._backend.connect_unix_socket(path, timeout, socket_options))

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


#: httpcore's errors and httpx's of the same name (the most specific first).
_HTTPX_ERRORS: tuple[tuple[type[Exception], type[httpx.TransportError]], ...] = (
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.NetworkError, httpx.NetworkError),
    (httpcore.ProxyError, httpx.ProxyError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.ProtocolError, httpx.ProtocolError),
)


@contextlib.contextmanager
def _as_httpx_errors() -> Iterator[None]:
    """httpcore's errors raised as httpx's, as httpx's own transport does."""
    try:
        yield
    except Exception as error:
        for core, public in _HTTPX_ERRORS:
            if isinstance(error, core):
                raise public(str(error)) from error
        raise


class _AnswerStream(httpx.SyncByteStream):
    """An answer's body from httpcore, its errors as httpx's."""

    def __init__(self, stream: Iterable[bytes]) -> None:
        self._stream = stream

    def __iter__(self) -> Iterator[bytes]:
        with _as_httpx_errors():
            yield from self._stream

    def close(self) -> None:
        close = getattr(self._stream, "close", None)
        if close is not None:
            with _as_httpx_errors():
                close()


class DeadlineTransport(httpx.BaseTransport):
    """httpx's HTTP/1.1 transport (same limits, TLS context), but every socket operation (connect,
    TLS handshake, each read and write) waits at most until the deadline of the exchange its thread
    is making (:meth:`Deadline.on_this_thread`), so no server can hold a call past it, however it
    trickles. Through the HTTP proxy at ``proxy`` when given.
    """

    def __init__(self, proxy: httpx.URL | None = None) -> None:
        options: dict[str, Any] = {  # httpx's defaults
            "ssl_context": httpx.create_ssl_context(),
            "max_connections": 100,
            "max_keepalive_connections": 20,
            "keepalive_expiry": 5.0,
            "network_backend": _DeadlineBackend(),
        }
        self._pool = (
            httpcore.ConnectionPool(**options)
            if proxy is None
            else httpcore.HTTPProxy(
                proxy_url=_core_url(proxy),
                proxy_auth=(proxy.username, proxy.password) if proxy.username else None,
                **options,
            )
        )

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.SyncByteStream)
        sent = httpcore.Request(
            method=request.method,
            url=_core_url(request.url),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        with _as_httpx_errors():
            answer = self._pool.handle_request(sent)
        assert isinstance(answer.stream, Iterable)
        return httpx.Response(
            answer.status,
            headers=answer.headers,
            stream=_AnswerStream(answer.stream),
            extensions=answer.extensions,
        )

    def close(self) -> None:
        self._pool.close()


def _core_url(url: httpx.URL) -> httpcore.URL:
    return httpcore.URL(scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path)


def environment_proxy(url: str) -> httpx.URL | None:
    """The HTTP(S) proxy the environment names for ``url`` (``http_proxy``, ``https_proxy``,
    ``all_proxy``, unless ``no_proxy`` covers its host), as httpx uses them; ``None``: connect
    directly (also for a proxy that is not ``http://`` or ``https://``)."""
    target = httpx.URL(url)
    proxies = urllib.request.getproxies()
    if not proxies or urllib.request.proxy_bypass(target.host):
        return None
    named = proxies.get(target.scheme) or proxies.get("all")
    if not named:
        return None
    proxy = httpx.URL(named if "://" in named else f"http://{named}")
    return proxy if proxy.scheme in ("http", "https") else None


def _server_fault(error: Exception) -> str | None:
    """What went wrong if it is worth retrying (no answer, 5xx), else ``None``."""
    if isinstance(error, ServerUnreachableError):
        return str(error)
    if isinstance(error, ServerRefusedError) and error.status >= 500:
        return f"HTTP {error.status}: {error.server_message[:200]}"
    return None


class ServiceApi:
    """Typed calls of ``/v1`` over a sync ``httpx.Client``; see the module docstring."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        transport: httpx.BaseTransport | None = None,
        http: httpx.Client | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        deadline_s: float = DEFAULT_DEADLINE_S,
        max_bytes: int = MAX_ANSWER_BYTES,
        retry: Retry | None = None,
    ) -> None:
        if http is None:
            if url is None:
                raise ValueError("give the server's url, or an httpx.Client as http")
            http = http_client(url, token, timeout_s, transport)
        self.url = str(http.base_url).rstrip("/")
        self.retry = retry
        self.deadline_s = deadline_s
        self.max_bytes = max_bytes
        self._http = http

    def __enter__(self) -> ServiceApi:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections."""
        self._http.close()

    # -- sending ---------------------------------------------------------------------------------

    def send(self, call: Call[R], attempts: int | None = None) -> R:
        """Send ``call`` (retried as :attr:`retry` says; ``attempts`` overrides its count)."""
        if self.retry is None:
            return self._once(call)
        limit = attempts if attempts is not None else self.retry.attempts
        failures = server_errors = 0
        while True:
            try:
                answer = self._once(call)
            except (ServerUnreachableError, ServerRefusedError) as error:
                fault = _server_fault(error)
                if fault is None:
                    raise
                failures += 1
                if isinstance(error, ServerRefusedError) and error.status != SERVICE_UNAVAILABLE:
                    server_errors += 1
                if limit is not None and failures >= limit:
                    raise
                if self.retry.max_server_errors is not None and server_errors >= self.retry.max_server_errors:
                    raise
                delay_s = self.retry.backoff.delay_s(failures - 1)
                log.warning("server away: %s: %s; retry %d in %.1f s", call.path, fault, failures, delay_s)
                self.retry.wait(delay_s)
                if limit is None and self.retry.stopping.is_set():
                    raise StopRequestedError(call.path) from None
                continue
            if failures:
                log.info("server answers again (%s, after %d failed attempts)", call.path, failures)
            return answer

    def _once(self, call: Call[R]) -> R:
        deadline = Deadline.after(call.timeout_s if call.timeout_s is not None else self.deadline_s)
        try:
            response = self._exchange(call, deadline)
        except httpx.HTTPError as error:
            raise _failure(self.url, call, error, deadline) from None
        return call.decode(checked(call.path, response))

    def _exchange(self, call: Call[Any], deadline: Deadline) -> httpx.Response:
        """The answer to ``call``, its body read within the bounds (see the module docstring)."""
        request = self._http.build_request(call.method, call.path, **call.request_kwargs())
        request.headers["Accept-Encoding"] = ACCEPT_ENCODING
        max_bytes = call.max_bytes if call.max_bytes is not None else self.max_bytes
        with deadline.on_this_thread():
            response = self._http.send(request, stream=True)
            try:
                body = CappedBody(response, max_bytes, f"{self.url}{call.path}")
                for raw in _raw_chunks(response):
                    for _step in body.feed(raw):
                        deadline.check()
                return _answered(response, body.content())
            finally:
                response.close()

    # -- sweeps, jobs, configs, misses ----------------------------------------------------------

    def submit(self, sweep: SweepCreate) -> SweepPublic:
        """``POST /v1/sweeps``."""
        return self.send(calls.submit(sweep))

    def sweep(self, sweep_id: int) -> SweepPublic:
        """``GET /v1/sweeps/{id}``."""
        return self.send(calls.sweep(sweep_id))

    def lookup(
        self, kernel: str, *, shape: str, dtype: str, chip: str, match: str, timeout_s: float | None = None
    ) -> LookupPublic:
        """``GET /v1/configs/{kernel}``: the config of one key, as loose as ``match`` allows."""
        return self.send(
            calls.lookup(kernel, shape=shape, dtype=dtype, chip=chip, match=match, timeout_s=timeout_s)
        )

    def configs(self, chip: str, kernel: str | None = None, timeout_s: float | None = None) -> ConfigBundle:
        """``GET /v1/configs``: every best config of a chip (optionally one kernel)."""
        return self.send(calls.configs(chip, kernel, timeout_s))

    def report_misses(self, misses: MissesCreate, timeout_s: float | None = None) -> MissesPublic:
        """``POST /v1/misses``."""
        return self.send(calls.report_misses(misses, timeout_s))

    # -- the worker protocol -------------------------------------------------------------------

    def register(self, worker: WorkerCreate) -> WorkerPublic:
        """``POST /v1/workers``."""
        return self.send(calls.register(worker))

    def lease(self, worker_id: int) -> LeasePublic | None:
        """``POST /v1/leases``: a lease, or ``None`` when there is no job for this worker now."""
        return self.send(calls.lease(worker_id))

    def heartbeat(self, token: str, attempts: int | None = None) -> LeasePublic:
        """``POST /v1/lease/heartbeat`` (the lease token in its header)."""
        return self.send(calls.heartbeat(token), attempts)

    def ask(self, token: str, n: int, holding: Sequence[int] = ()) -> AskPublic:
        """``POST /v1/lease/ask?n=&holding=`` (see :func:`calls.ask`)."""
        return self.send(calls.ask(token, n, holding))

    def tell(self, token: str, outcomes: Sequence[TrialOutcome], attempts: int | None = None) -> TellPublic:
        """``POST /v1/lease/tell``; idempotent, so retrying is safe."""
        return self.send(calls.tell(token, outcomes), attempts)

    def complete(self, token: str, results: Sequence[ValidatedConfig]) -> None:
        """``POST /v1/lease/complete``."""
        self.send(calls.complete(token, results))

    def release(self, token: str, reason: str, failed: bool, attempts: int | None = None) -> None:
        """``POST /v1/lease/release``."""
        self.send(calls.release(token, reason, failed), attempts)


class AsyncServiceApi:
    """:class:`ServiceApi`'s twin over an ``httpx.AsyncClient`` (one attempt per call).

    Has the calls an asyncio program makes at run time (lookups, the bulk export, miss
    reports); :meth:`send` sends any other :class:`~tiletune.client.calls.Call` (e.g.
    ``await api.send(calls.sweep(7))``).
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        deadline_s: float = DEFAULT_DEADLINE_S,
        max_bytes: int = MAX_ANSWER_BYTES,
    ) -> None:
        self.url = url.rstrip("/")
        self.deadline_s = deadline_s
        self.max_bytes = max_bytes
        self._http = httpx.AsyncClient(
            base_url=url, headers=_headers(token), timeout=_timeout(timeout_s), transport=transport
        )

    async def __aenter__(self) -> AsyncServiceApi:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connections."""
        await self._http.aclose()

    async def send(self, call: Call[R]) -> R:
        """Send ``call`` once, within its bounds (see the module docstring)."""
        deadline = Deadline.after(call.timeout_s if call.timeout_s is not None else self.deadline_s)
        try:
            async with asyncio.timeout(deadline.left_s()):
                response = await self._exchange(call)
        except TimeoutError:
            raise ServerUnreachableError(deadline.missed(self.url, call)) from None
        except httpx.HTTPError as error:
            raise _failure(self.url, call, error, deadline) from None
        return call.decode(checked(call.path, response))

    async def _exchange(self, call: Call[Any]) -> httpx.Response:
        """The answer to ``call``, its body read within its cap."""
        request = self._http.build_request(call.method, call.path, **call.request_kwargs())
        request.headers["Accept-Encoding"] = ACCEPT_ENCODING
        max_bytes = call.max_bytes if call.max_bytes is not None else self.max_bytes
        response = await self._http.send(request, stream=True)
        try:
            body = CappedBody(response, max_bytes, f"{self.url}{call.path}")
            async for raw in _async_raw_chunks(response):
                for _step in body.feed(raw):
                    await asyncio.sleep(0)  # a large body never holds the event loop
            return _answered(response, body.content())
        finally:
            await response.aclose()

    async def lookup(
        self, kernel: str, *, shape: str, dtype: str, chip: str, match: str, timeout_s: float | None = None
    ) -> LookupPublic:
        """``GET /v1/configs/{kernel}``."""
        return await self.send(
            calls.lookup(kernel, shape=shape, dtype=dtype, chip=chip, match=match, timeout_s=timeout_s)
        )

    async def configs(
        self, chip: str, kernel: str | None = None, timeout_s: float | None = None
    ) -> ConfigBundle:
        """``GET /v1/configs``."""
        return await self.send(calls.configs(chip, kernel, timeout_s))

    async def report_misses(self, misses: MissesCreate, timeout_s: float | None = None) -> MissesPublic:
        """``POST /v1/misses``."""
        return await self.send(calls.report_misses(misses, timeout_s))
