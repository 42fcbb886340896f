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
cap, having held at most the cap and one step (:class:`~tiletune.client.answer_body.CappedBody`).
Past the deadline (:class:`~tiletune.client.deadline.Deadline`) a call raises
:class:`ServerUnreachableError`, past the cap :class:`UnexpectedAnswerError`; no connection is
left behind. The async twin runs each exchange under ``asyncio.timeout``; the sync twin's own
transport (:class:`~tiletune.client.transport.DeadlineTransport`, the default) cuts every socket
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
import logging
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TypeVar

import httpx

from tiletune.client import calls
from tiletune.client.answer_body import (
    ACCEPT_ENCODING,
    CappedBody,
    async_raw_chunks,
    decoded_response,
    raw_chunks,
)
from tiletune.client.calls import (
    MAX_ANSWER_BYTES,
    ApiError,
    Call,
    ServerRefusedError,
    ServerUnreachableError,
    UnexpectedAnswerError,
    checked,
)
from tiletune.client.deadline import Deadline
from tiletune.client.transport import DeadlineTransport, environment_proxy
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
#: The status of a server whose database is away for now: always retried.
SERVICE_UNAVAILABLE = 503
#: The status of a server whose database's disk is full (nothing written): retried as a 503.
STORAGE_FULL = 507
#: The 5xx statuses that say the server is unable for now, not failing on the request.
WAIT_STATUSES = (SERVICE_UNAVAILABLE, STORAGE_FULL)


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
    consecutive 5xx answers other than 503 and 507 after which a call gives up and raises the last
    :class:`ServerRefusedError` (a request the server fails on every time is no outage;
    ``None``: retry those too). A 503 (the server's database is away), a 507 (its disk is full)
    and no answer at all are always retried.
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
    is ``transport``, else a :class:`~tiletune.client.transport.DeadlineTransport` (through the
    environment's proxy for ``url``)."""
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
                if isinstance(error, ServerRefusedError) and error.status not in WAIT_STATUSES:
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
                for raw in raw_chunks(response):
                    for _step in body.feed(raw):
                        deadline.check()
                return decoded_response(response, body.content())
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
            async for raw in async_raw_chunks(response):
                for _step in body.feed(raw):
                    await asyncio.sleep(0)  # a large body never holds the event loop
            return decoded_response(response, body.content())
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
