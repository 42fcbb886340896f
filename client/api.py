"""The REST client of ``/v1``: :class:`ServiceApi` (sync) and :class:`AsyncServiceApi` (asyncio).

The only code that speaks HTTP to a tiletune server: the worker, the ``tiletune`` command
and the runtime clients (:class:`~tiletune.client.sync.ConfigClient`, its async twin) all
send their calls through it. The twins have the same method names; each call is built
once in :mod:`tiletune.client.calls` and raises the errors defined there.

httpx is the transport and the seam: ``transport=`` takes the app's ASGI or WSGI transport
in tests, or ``http=`` a ready ``httpx.Client`` (Starlette's ``TestClient`` is one). The
bearer token goes in the ``Authorization`` header, never in a URL.

Retrying (sync twin): with a :class:`Retry`, a call that gets no answer or a 5xx is sent
again after a capped exponential :class:`Backoff` until it succeeds, its ``attempts`` are
spent (the last error is raised), or, for unbounded calls, the retry's ``stopping`` event is
set (:class:`StopRequestedError`). A 4xx is never retried. Without a :class:`Retry` each
call is one attempt.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import TypeVar

import httpx

from tiletune.client import calls
from tiletune.client.calls import (
    ApiError,
    Call,
    ServerRefusedError,
    ServerUnreachableError,
    UnexpectedAnswerError,
    checked,
    redacted,
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

#: Default seconds per request (connect: 10 s).
DEFAULT_TIMEOUT_S = 30.0
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
    """An ``httpx.Client`` for the server at ``url``, the bearer token in its headers."""
    return httpx.Client(
        base_url=url, headers=_headers(token), timeout=_timeout(timeout_s), transport=transport
    )


def _failure(url: str, call: Call[R], error: httpx.HTTPError) -> ApiError:
    """The call's error for an httpx failure: no answer, or an answer that cannot be read
    (a body that does not decode as its ``Content-Encoding`` says, too many redirects)."""
    if isinstance(error, httpx.TransportError):
        return ServerUnreachableError(f"cannot reach the server at {url} ({type(error).__name__}: {error})")
    return UnexpectedAnswerError(
        f"{url}{redacted(call.path)} answered something that cannot be read ({type(error).__name__})"
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
        retry: Retry | None = None,
    ) -> None:
        if http is None:
            if url is None:
                raise ValueError("give the server's url, or an httpx.Client as http")
            http = http_client(url, token, timeout_s, transport)
        self.url = str(http.base_url).rstrip("/")
        self.retry = retry
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
                where = redacted(call.path)
                log.warning("server away: %s: %s; retry %d in %.1f s", where, fault, failures, delay_s)
                self.retry.wait(delay_s)
                if limit is None and self.retry.stopping.is_set():
                    raise StopRequestedError(redacted(call.path)) from None
                continue
            if failures:
                log.info("server answers again (%s, after %d failed attempts)", redacted(call.path), failures)
            return answer

    def _once(self, call: Call[R]) -> R:
        try:
            response = self._http.request(call.method, call.path, **call.request_kwargs())
        except httpx.HTTPError as error:
            raise _failure(self.url, call, error) from None
        return call.decode(checked(call.path, response))

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
        """``POST /v1/leases/{token}/heartbeat``."""
        return self.send(calls.heartbeat(token), attempts)

    def ask(self, token: str, n: int, holding: Sequence[int] = ()) -> AskPublic:
        """``POST /v1/lease/ask?n=&holding=`` (see :func:`calls.ask`)."""
        return self.send(calls.ask(token, n, holding))

    def tell(self, token: str, outcomes: Sequence[TrialOutcome], attempts: int | None = None) -> TellPublic:
        """``POST /v1/lease/tell``; idempotent, so retrying is safe."""
        return self.send(calls.tell(token, outcomes), attempts)

    def complete(self, token: str, results: Sequence[ValidatedConfig]) -> None:
        """``POST /v1/leases/{token}/complete``."""
        self.send(calls.complete(token, results))

    def release(self, token: str, reason: str, failed: bool, attempts: int | None = None) -> None:
        """``POST /v1/leases/{token}/release``."""
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
    ) -> None:
        self.url = url.rstrip("/")
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
        """Send ``call`` once."""
        try:
            response = await self._http.request(call.method, call.path, **call.request_kwargs())
        except httpx.HTTPError as error:
            raise _failure(self.url, call, error) from None
        return call.decode(checked(call.path, response))

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
