"""The sync twin's own transport: every socket operation cut to the call's deadline.

:class:`DeadlineTransport` is httpx's HTTP/1.1 transport over httpcore, except that each
connect, TLS handshake, read and write waits at most until the deadline of the exchange its
thread is making (:meth:`~tiletune.client.deadline.Deadline.on_this_thread`), so a server that
trickles its headers a byte at a time cannot hold a call. httpcore's errors are raised as
httpx's, as httpx's own transport does. :func:`environment_proxy` is the HTTP proxy the
environment names for a URL, as httpx would use it.
"""

from __future__ import annotations

import contextlib
import urllib.request
from collections.abc import Iterable, Iterator
from typing import Any

import httpcore
import httpx

from tiletune.client.deadline import cut_to_deadline

#: Bytes handed to a socket per write of :class:`DeadlineTransport` (each cut to the time left).
WRITE_STEP_BYTES = 64 * 1024


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose every operation waits at most until its thread's deadline
    (:func:`~tiletune.client.deadline.cut_to_deadline`)."""

    def __init__(self, stream: httpcore.NetworkStream) -> None:
        self._stream = stream

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, cut_to_deadline(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        for start in range(0, len(buffer), WRITE_STEP_BYTES):
            step = buffer[start : start + WRITE_STEP_BYTES]
            self._stream.write(step, cut_to_deadline(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        timeout = cut_to_deadline(timeout, httpcore.ConnectTimeout)
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
        timeout = cut_to_deadline(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._backend.connect_tcp(host, port, timeout, local_address, socket_options))

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        timeout = cut_to_deadline(timeout, httpcore.ConnectTimeout)
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
    is making (:meth:`~tiletune.client.deadline.Deadline.on_this_thread`), so no server can hold a
    call past it, however it trickles. Through the HTTP proxy at ``proxy`` when given.
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
