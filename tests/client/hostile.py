"""Stand-in *servers* for the client's tests of hostile answers.

:class:`HostileServer`, a minimal ASGI app under uvicorn, answers each path with what the test
sets (an HTML page, another schema, garbage, a 5xx, a bundle with an ETag and ``304`` to
``If-None-Match``, a gzip body) and records every request (method, path, query, headers), over
real HTTP. :class:`RawServer` speaks HTTP by hand on a socket, to misbehave below HTTP: it
trickles its headers or its body, accepts and never answers, or answers a gzip bomb. The
client under test is real.
"""

from __future__ import annotations

import functools
import gzip
import json
import socket
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import uvicorn

from tiletune.client.wire import BestConfigPublic, ConfigBundle
from tiletune.kernels import get_kernel
from tiletune.kernels.info import kernel_info

from .conftest import CHIP, free_port


@dataclass
class Seen:
    """One request as the server saw it (header names in lower case)."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]


@dataclass
class Reply:
    """What the server answers."""

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


Responder = Callable[[Seen], Reply]


def json_reply(document: str | bytes, status: int = 200, **headers: str) -> Reply:
    body = document.encode() if isinstance(document, str) else document
    return Reply(status, body, {"content-type": "application/json", **headers})


HTML = Reply(200, b"<html><body>Please sign in</body></html>", {"content-type": "text/html"})
OTHER_SCHEMA = json_reply('{"items": [1, 2, 3], "next": null}')
GARBAGE = Reply(200, b"\x00\xff{{{not json", {"content-type": "application/json"})
SERVER_ERROR = json_reply('{"code": "internal", "message": "boom"}', status=500)
BAD_GZIP = Reply(200, b"this is not gzip", {"content-type": "application/json", "content-encoding": "gzip"})


def entry(kernel: str, shape: dict[str, int], config: Mapping[str, Any], **fields: Any) -> dict[str, Any]:
    """A bundle entry as JSON (its config unchecked: the test decides what it holds)."""
    return {
        "kernel": kernel,
        "kernel_version": 1,
        "shape": shape,
        "shape_key": ",".join(f"{k}={v}" for k, v in shape.items()),
        "dtype": "float32",
        "chip": CHIP,
        "config": config,
        "median_ms": 1.0,
        "promoted_at": datetime.now(UTC).isoformat(),
        **fields,
    }


def bundle_json(entries: list[dict[str, Any]], kernels: tuple[str, ...] = ("add",)) -> str:
    """A bundle of ``entries`` with the real kernel infos the server sends for ``kernels``."""
    infos = [kernel_info(get_kernel(name)).model_dump(mode="json") for name in kernels]
    configs = [BestConfigPublic.model_validate(e).model_dump(mode="json") for e in entries]
    return ConfigBundle.model_validate({"chip": CHIP, "kernels": infos, "configs": configs}).model_dump_json()


def lookup_json(
    kernel: str, shape: dict[str, int], config: dict[str, Any], match: str = "exact", **fields: Any
) -> str:
    """A single-key lookup answer (the config unchecked)."""
    best = entry(kernel, shape, config)
    answer = {"kernel": kernel, "shape": shape, "dtype": "float32", "chip": CHIP, "config": config}
    return json.dumps({**answer, "match": match, "best": best, **fields})


def gzipped(reply: Reply) -> Reply:
    return Reply(reply.status, gzip.compress(reply.body), {**reply.headers, "content-encoding": "gzip"})


class HostileServer:
    """The ASGI app: ``routes[path]`` answers each request of ``path`` (404 for any other)."""

    def __init__(self) -> None:
        self.routes: dict[str, Responder] = {}
        self.seen: list[Seen] = []
        self.url = ""

    def answer(self, path: str, reply: Reply | Responder) -> None:
        """Answer ``path`` with ``reply`` (a fixed reply or a function of the request)."""
        self.routes[path] = reply if callable(reply) else (lambda _seen: reply)

    def requests(self, path: str) -> list[Seen]:
        return [seen for seen in self.seen if seen.path == path]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        while True:  # drain the body
            message = await receive()
            if not message.get("more_body"):
                break
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        query = dict(parse_qsl(scope["query_string"].decode()))
        seen = Seen(scope["method"], scope["path"], query, headers)
        self.seen.append(seen)
        route = self.routes.get(scope["path"])
        reply = (
            route(seen) if route is not None else json_reply('{"code": "not_found", "message": "no"}', 404)
        )
        raw_headers = [(k.encode(), v.encode()) for k, v in reply.headers.items()]
        raw_headers.append((b"content-length", str(len(reply.body)).encode()))
        await send({"type": "http.response.start", "status": reply.status, "headers": raw_headers})
        await send({"type": "http.response.body", "body": reply.body})


def serve(app: HostileServer) -> Iterator[HostileServer]:
    """Serve ``app`` on a free port for the duration of the generator."""
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    served = uvicorn.Server(config)
    thread = threading.Thread(target=served.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not served.started and time.monotonic() < deadline:
        time.sleep(0.02)
    app.url = f"http://127.0.0.1:{port}"
    yield app
    served.should_exit = True
    thread.join(timeout=10)


# -- servers that misbehave below HTTP: trickling, silent, a gzip bomb -----------------------------

#: Seconds between the bytes a trickling server sends (shorter than any read timeout of the client).
TRICKLE_PERIOD_S = 0.2
#: Seconds a misbehaving server keeps a connection at most: a client without a deadline waits that long.
MISBEHAVE_FOR_S = 3.0
#: What a gzip bomb inflates to: more than 1 GiB.
BOMB_INFLATED_BYTES = 65 * (16 << 20)
#: The most bytes of a request's head the stand-in reads.
MAX_HEAD_BYTES = 64 * 1024

#: How a :class:`RawServer` answers one connection (its request read), given the server.
Behaviour = Callable[[socket.socket, "RawServer"], None]


@functools.cache
def gzip_bomb() -> bytes:
    """A valid gzip body of ``BOMB_INFLATED_BYTES`` zeros, about 1 MiB (built once, in chunks).

    Each 16 MiB of zeros is compressed after a full flush, so every chunk but the first compresses to
    the same bytes: the body is built from three compressions, not from 1 GiB of input.
    """
    zeros = bytes(16 << 20)
    deflate = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    first = deflate.compress(zeros) + deflate.flush(zlib.Z_FULL_FLUSH)
    repeated = deflate.compress(zeros) + deflate.flush(zlib.Z_FULL_FLUSH)
    assert deflate.compress(zeros) + deflate.flush(zlib.Z_FULL_FLUSH) == repeated
    chunks = BOMB_INFLATED_BYTES // len(zeros)
    crc = 0
    for _ in range(chunks):
        crc = zlib.crc32(zeros, crc)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    trailer = struct.pack("<II", crc, BOMB_INFLATED_BYTES & 0xFFFFFFFF)
    return header + first + repeated * (chunks - 1) + deflate.flush() + trailer


def _send(connection: socket.socket, data: bytes) -> bool:
    """Send ``data``; ``False`` when the client has gone."""
    try:
        connection.sendall(data)
    except OSError:
        return False
    return True


def _trickle(connection: socket.socket, server: RawServer, start: bytes, byte: bytes) -> None:
    """Send ``start``, then ``byte`` every ``TRICKLE_PERIOD_S`` for ``MISBEHAVE_FOR_S``."""
    until = time.monotonic() + MISBEHAVE_FOR_S
    if not _send(connection, start):
        return
    while time.monotonic() < until and not server.stopping.wait(TRICKLE_PERIOD_S):
        if not _send(connection, byte):
            return


def trickled_headers(connection: socket.socket, server: RawServer) -> None:
    """A status line, then a header one byte at a time."""
    _trickle(connection, server, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Slow: ", b"a")


def trickled_body(connection: socket.socket, server: RawServer) -> None:
    """The headers of a 100,000-byte JSON body, then the body one byte (a space) at a time."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
    _trickle(connection, server, head, b" ")


def no_answer(_connection: socket.socket, server: RawServer) -> None:
    """The request is read; nothing is sent for ``MISBEHAVE_FOR_S``."""
    server.stopping.wait(MISBEHAVE_FOR_S)


def bomb(connection: socket.socket, _server: RawServer) -> None:
    """A 200 whose gzip body (:func:`gzip_bomb`) inflates to more than 1 GiB."""
    body = gzip_bomb()
    head = (
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    if _send(connection, head.encode()):  # not joined to the body: no 1 MiB copy in the traced process
        _send(connection, body)


def replying(reply: Reply) -> Behaviour:
    """An ordinary answer (then the connection is closed)."""

    def answer(connection: socket.socket, _server: RawServer) -> None:
        head = [f"HTTP/1.1 {reply.status} -", f"Content-Length: {len(reply.body)}", "Connection: close"]
        head += [f"{name}: {value}" for name, value in reply.headers.items()]
        _send(connection, ("\r\n".join(head) + "\r\n\r\n").encode() + reply.body)

    return answer


def in_turn(*behaviours: Behaviour) -> Behaviour:
    """Each connection answered by the next of ``behaviours``; the last answers the rest."""
    turns = iter(behaviours)

    def answer(connection: socket.socket, server: RawServer) -> None:
        next(turns, behaviours[-1])(connection, server)

    return answer


@dataclass
class Connection:
    """A request as a :class:`RawServer` saw it: when it arrived, its method, target and headers
    (names in lower case)."""

    at: float
    method: str
    target: str
    headers: dict[str, str]

    @property
    def path(self) -> str:
        """The target's path (of an absolute-form target too)."""
        return urlsplit(self.target).path


class RawServer:
    """A stand-in server that speaks HTTP/1.1 by hand on 127.0.0.1, so that it can misbehave where
    HTTP libraries cannot: each request is read, then answered by the :data:`Behaviour` set for its
    path (a 404 for any other), on a thread of its own. Requests in absolute form (through a proxy)
    are routed by their path too."""

    def __init__(self) -> None:
        self.routes: dict[str, Behaviour] = {}
        self.seen: list[Connection] = []
        self.stopping = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def answer(self, path: str, behaviour: Behaviour | Reply) -> None:
        self.routes[path] = replying(behaviour) if isinstance(behaviour, Reply) else behaviour

    def requests(self, path: str) -> list[Connection]:
        return [seen for seen in self.seen if seen.path == path]

    def __enter__(self) -> RawServer:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stopping.set()
        self._thread.join(timeout=10)
        self._listener.close()

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                connection, _ = self._listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        with connection:
            request = _read_request(connection)
            if request is None:
                return
            seen = Connection(time.monotonic(), *request)
            self.seen.append(seen)
            not_found = replying(json_reply('{"code": "not_found", "message": "no"}', 404))
            self.routes.get(seen.path, not_found)(connection, self)


def _read_request(connection: socket.socket) -> tuple[str, str, dict[str, str]] | None:
    """Read one request (head and ``Content-Length`` body): its method, target and headers;
    ``None`` if it was cut."""
    connection.settimeout(MISBEHAVE_FOR_S)
    data = b""
    try:
        while b"\r\n\r\n" not in data and len(data) < MAX_HEAD_BYTES:
            chunk = connection.recv(65536)
            if not chunk:
                return None
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        fields = [line.split(":", 1) for line in lines[1:] if ":" in line]
        headers = {name.strip().lower(): value.strip() for name, value in fields}
        missing = int(headers.get("content-length", "0")) - len(body)
        while missing > 0:
            chunk = connection.recv(min(missing, 65536))
            if not chunk:
                return None
            missing -= len(chunk)
    except (OSError, ValueError):
        return None
    method, target, _version = lines[0].split(" ", 2)
    return method, target, headers
