"""A stand-in *server* for the client's tests of hostile answers: a minimal ASGI app under uvicorn.

It answers each path with what the test sets (an HTML page, another schema, garbage, a 5xx,
a bundle with an ETag and ``304`` to ``If-None-Match``, a gzip body) and records every
request (method, path, query, headers), over real HTTP. The client under test is real.
"""

from __future__ import annotations

import gzip
import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl

import uvicorn

from tiletune.client.wire import BestConfigPublic, ConfigBundle
from tiletune.kernels import get_kernel
from tiletune.service.specs import kernel_info

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
