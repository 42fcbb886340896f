"""Request bodies: each route's cap, JSON structure bounded before validation, large bodies checked
off the event loop, only from callers the route takes, and a deadline for a body (and a head) to
arrive (:mod:`tiletune.service.access.bodies`, :mod:`tiletune.service.access.body_json`,
:func:`tiletune.service.cli.serve.head_timeout_protocol`).

The caps are measured here: the largest body each route's wire model accepts (compact JSON,
every text at its length limit in 4-byte characters) must fit its cap, and the cap must not be
much larger. The event loop's freedom, the server's memory and the deadlines are measured
against real ``tiletune server`` processes.
"""

from __future__ import annotations

import json
import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.credentials import ADMIN, ADMIN_SECRET
from tests.service.processes import ServerProcess, start_server, stop
from tests.service.test_auth import POLICY
from tiletune.client.wire import (
    MAX_DB_INT,
    MAX_DIM,
    MAX_REPORTED_ANSWERS,
    MAX_REPORTED_KEYS,
    MAX_SOFTWARE_TEXT,
    ConfigBundle,
    MissesCreate,
    SweepCreate,
    TellCreate,
    software_text,
)
from tiletune.service.access.bodies import NO_BODY_BYTES, ROUTE_BODIES, SMALL_BODY_BYTES, route_body
from tiletune.service.access.body_json import (
    MAX_DEPTH,
    MAX_ELEMENTS,
    MAX_KEYS,
    BodyRefusedError,
    check_structure,
)
from tiletune.service.app import create_app
from tiletune.service.migrate import upgrade
from tiletune.service.settings import Settings

CEILING_BYTES = Settings.model_fields["max_body_bytes"].default
JSON = {"Content-Type": "application/json"}
CHIP = {"name": "cpu/Body Test Chip/2c", "kind": "cpu", "local_memory_bytes": 1 << 20}
MISS = {"kernel": "add", "shape": {"n": 64}, "dtype": "float32", "chip": CHIP["name"], "match": "default"}

# -- the largest legal body of each route ----------------------------------------------------------

WIDE = "\U0001f600"  # a 4-byte character the wire's texts take
LETTER = "\U0001d400"  # a 4-byte letter (token names take letters, digits and a few signs)
MS = 1.0000000000000002e-06  # a time in range with the longest text


def _text(chars: int) -> str:
    return WIDE * chars


def _name(index: int) -> str:
    """An identifier of the longest length (64)."""
    return f"k{index}".ljust(64, "x")


def _dims(count: int) -> dict[str, int]:
    return {_name(index): MAX_DIM for index in range(count)}


def _software() -> dict[str, str | None]:
    """The longest fingerprint: as many packages as its text (at most 1,000 characters) holds."""
    software: dict[str, str | None] = {}
    for index in range(32):
        for length in range(200, 0, -1):
            if len(software_text({**software, _name(index): "v" * length})) <= MAX_SOFTWARE_TEXT:
                software[_name(index)] = "v" * length
                break
    return software


def _measurement() -> dict[str, Any]:
    return {"median_ms": MS, "p10_ms": MS, "p90_ms": MS, "min_ms": MS, "samples": 10**9, "pruned": False}


def _largest_bodies() -> dict[str, Any]:
    """Each capped route's largest legal body, with every field present and at its limit."""
    chip = {"name": _text(200), "kind": "x" * 16, "local_memory_bytes": MAX_DIM}
    return {
        "POST /v1/workers": {
            "name": _text(200),
            "chip": {**chip, "max_buffer_num": 64, "alignment_bytes": 4096},
            "backends": [_name(i) for i in range(16)],
            "kernels": [_name(i) for i in range(256)],
            "kernel_versions": {_name(i): 2**31 for i in range(256)},
            "software": _software(),
        },
        "POST /v1/leases": {"worker_id": MAX_DB_INT},
        "POST /v1/lease/complete": {
            "results": [{"config": _dims(32), "measurement": _measurement(), "error": _text(2000)}] * 64
        },
        "POST /v1/lease/release": {"reason": _text(2000), "failed": False},
        "POST /v1/client-stats": {
            "chip": _text(200),
            "answers": dict.fromkeys(("exact", "nearest", "default"), MAX_REPORTED_ANSWERS),
            "keys": [
                {"kernel": _name(0), "shape": _dims(16), "dtype": _text(16), "count": MAX_REPORTED_ANSWERS}
            ]
            * MAX_REPORTED_KEYS,
        },
        "POST /v1/tokens": {"role": "worker", "name": LETTER * 200, "chip": _text(200)},
    }


def _encoded(body: Any) -> bytes:
    """A body as clients send it (compact JSON, UTF-8 text)."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def test_each_routes_cap_fits_its_largest_legal_body_and_little_more() -> None:
    for route, body in _largest_bodies().items():
        spec = ROUTE_BODIES[route]
        assert spec.model is not None
        spec.model.model_validate(body)  # legal
        size = len(_encoded(body))
        cap = spec.cap(CEILING_BYTES)
        assert size * 1.25 <= cap < size * 2.5 or cap == NO_BODY_BYTES, (route, size, cap)


def test_routes_whose_legal_bodies_pass_the_ceiling_take_the_ceiling() -> None:
    misses = {"misses": [{**MISS, "shape": _dims(16), "chip": _text(200), "count": 10**6}] * 4_000}
    outcome = {"trial_id": 1, "measurement": _measurement(), "invalid": _text(2000), "error": _text(2000)}
    tell = {"outcomes": [outcome] * 600}
    shapes = [_dims(16)] * 1000
    sweep = {"kernels": [{"kernel": _name(0), "shapes": shapes}] * 7}
    for model, body in ((MissesCreate, misses), (TellCreate, tell), (SweepCreate, sweep)):
        model.model_validate(body)
        assert len(_encoded(body)) > CEILING_BYTES, model
    assert ConfigBundle.model_fields["configs"].metadata == []  # as many configs as the bytes hold
    for route in ("POST /v1/misses", "POST /v1/lease/tell", "POST /v1/sweeps", "POST /v1/configs/import"):
        assert ROUTE_BODIES[route].cap(CEILING_BYTES) == CEILING_BYTES
        assert ROUTE_BODIES[route].cap(4096) == 4096  # the ceiling bounds every route


def _values(document: Any) -> int:
    """The JSON values of a document: its scalars, arrays and objects (keys are not values)."""
    if isinstance(document, dict):
        return 1 + sum(_values(value) for value in document.values())
    if isinstance(document, list):
        return 1 + sum(_values(value) for value in document)
    return 1


def test_the_values_caps_fit_the_largest_legal_bodies_as_the_scan_counts_them() -> None:
    report = {**MISS, "shape": _dims(16), "chip": _text(200), "count": 10**6}
    outcome = {"trial_id": 1, "measurement": _measurement(), "invalid": "x", "error": "x"}
    for route, model, document in (
        ("POST /v1/misses", MissesCreate, {"misses": [report] * 10_000}),
        ("POST /v1/lease/tell", TellCreate, {"outcomes": [outcome] * 1000}),
    ):
        model.model_validate(document)
        max_values = ROUTE_BODIES[route].max_values
        assert max_values is not None
        assert _values(document) <= max_values < 1.25 * _values(document), route
    sample = {"misses": [report] * 50, "nested": [[1, [2, {}]], [], {"k": "v, w: x"}]}
    check_structure(_encoded(sample), max_values=_values(sample))
    with pytest.raises(BodyRefusedError, match="more than"):
        check_structure(_encoded(sample), max_values=_values(sample) - 1)


def test_every_route_that_takes_a_body_has_a_cap_and_the_same_model(app: TestClient) -> None:
    document = app.get("/openapi.json").json()
    documented = {}
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            if "requestBody" in operation:
                schema = operation["requestBody"]["content"]["application/json"]["schema"]
                documented[f"{method.upper()} {path}"] = schema
    with_models = {route: spec.model for route, spec in ROUTE_BODIES.items() if spec.model is not None}
    assert set(documented) == set(with_models)
    for route, model in with_models.items():
        schema = documented[route]
        if "$ref" in schema:
            assert schema["$ref"].rsplit("/", 1)[-1] == model.__name__, route
        else:  # a body the route checks itself, documented inline
            assert schema["description"] == model.model_json_schema()["description"], route
    for route, spec in ROUTE_BODIES.items():  # a large body's caller needs the route's own role
        if spec.model is not None:
            method, path = route.split(" ", 1)
            assert spec.role == POLICY[(method, path)], route
    assert route_body("POST", "/v1/lease/tell") is ROUTE_BODIES["POST /v1/lease/tell"]
    assert route_body("POST", "/v1/leases/some-token/tell").max_bytes == NO_BODY_BYTES  # no such route
    assert route_body("POST", "/v1/lease/heartbeat").max_bytes == NO_BODY_BYTES
    assert route_body("GET", "/v1/sweeps").max_bytes == NO_BODY_BYTES


# -- against the app ------------------------------------------------------------------------------


@pytest.fixture
def app(tmp_path: Path) -> Iterator[TestClient]:
    url = f"sqlite:///{tmp_path / 't.db'}"
    upgrade(url)
    with TestClient(create_app(Settings(db_url=url, admin_token=ADMIN_SECRET), reaper=False)) as client:
        yield client


def _token(app: TestClient, role: str) -> dict[str, str]:
    made = app.post("/v1/tokens", json={"role": role, "name": role}, headers=ADMIN)
    assert made.status_code == 201, made.text
    return {"Authorization": f"Bearer {made.json()['token']}"}


def _object_of(keys: int) -> bytes:
    return ("{" + ",".join(f'"k{i}":1' for i in range(keys)) + "}").encode()


def test_a_body_over_its_routes_cap_is_refused_naming_the_cap(app: TestClient) -> None:
    for declared in (True, False):
        body = b'{"role":"reader","name":"' + b"x" * 3000 + b'"}'
        content: bytes | Iterator[bytes] = body if declared else iter([body[:1000], body[1000:]])
        refused = app.post("/v1/tokens", content=content, headers={**ADMIN, **JSON})
        assert refused.status_code == 413, refused.text
        assert refused.json() == {
            "code": "too_large",
            "message": "the request body is over 2,048 bytes, the most POST /v1/tokens takes",
            "field": "body",
        }
    no_body = app.post("/v1/lease/heartbeat", content=b"x" * (NO_BODY_BYTES + 1), headers=ADMIN)
    assert no_body.status_code == 413
    assert [token["name"] for token in app.get("/v1/tokens", headers=ADMIN).json()] == ["admin"]


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (_object_of(MAX_KEYS + 1), f"an object of more than {MAX_KEYS:,} keys"),
        (("[" + ",".join(["1"] * (MAX_ELEMENTS + 1)) + "]").encode(), f"more than {MAX_ELEMENTS:,} elements"),
        (b"[" * (MAX_DEPTH + 1) + b"1" + b"]" * (MAX_DEPTH + 1) + b" " * SMALL_BODY_BYTES, "deeper than 32"),
        (json.dumps({"misses": [MISS] * 40_000}).encode(), "more than 250,000 values"),
    ],
    ids=["keys", "elements", "depth", "values"],
)
def test_a_large_body_over_a_structure_limit_is_refused_before_it_is_parsed(
    app: TestClient, body: bytes, reason: str
) -> None:
    refused = app.post("/v1/misses", content=body, headers={**ADMIN, **JSON})
    assert refused.status_code == 413, refused.text
    assert refused.json()["field"] == "body"
    assert reason in refused.json()["message"]


def test_a_large_body_is_read_only_from_a_token_its_route_takes(app: TestClient) -> None:
    reader = _token(app, "reader")
    body = _object_of(MAX_KEYS + 1)
    anonymous = app.post("/v1/sweeps", content=body, headers=JSON)
    assert anonymous.status_code == 401
    assert anonymous.headers["www-authenticate"] == "Bearer"
    assert "needs a submitter token" in anonymous.json()["message"]
    bogus = app.post("/v1/sweeps", content=body, headers={**JSON, "Authorization": "Bearer tt_unknown"})
    assert bogus.status_code == 401
    forbidden = app.post("/v1/sweeps", content=body, headers={**JSON, **reader})
    assert forbidden.status_code == 403
    assert forbidden.json()["field"] == "authorization"
    assert app.post("/v1/misses", content=body, headers={**JSON, **reader}).status_code == 413


def test_a_large_invalid_body_names_its_first_fault(app: TestClient) -> None:
    reader = _token(app, "reader")
    bad_report = {
        "kernel": 1,
        "shape": {f"d{i}": "x" for i in range(16)},
        "dtype": 1,
        "chip": 1,
        "count": "x",
    }
    refused = app.post("/v1/misses", json={"misses": [MISS, bad_report] * 2000}, headers=reader)
    assert refused.status_code == 422
    assert refused.json() == {
        "code": "invalid",
        "message": "misses[1].kernel: Input should be a valid string",
        "field": "misses[1].kernel",
    }
    truncated = app.post(
        "/v1/misses", content=json.dumps({"misses": [MISS] * 200})[:-5], headers={**JSON, **reader}
    )
    assert truncated.status_code == 422
    assert truncated.json()["field"] == "body"
    assert truncated.json()["message"].startswith("the body is not valid JSON:")
    small = app.post("/v1/misses", content=b"{nope", headers={**JSON, **reader})
    assert (small.status_code, small.json()["field"]) == (422, "body")


def test_large_valid_bodies_are_taken(app: TestClient) -> None:
    reader = _token(app, "reader")
    reported = app.post("/v1/misses", json={"misses": [MISS] * 1000}, headers=reader)
    assert reported.status_code == 200, reported.text
    assert reported.json()["accepted"] == 1000
    shapes = [{"n": 64 + i} for i in range(1000)]
    swept = app.post("/v1/sweeps", json={"kernel": "add", "shapes": shapes, "trials": 1}, headers=ADMIN)
    assert swept.status_code == 201, swept.text
    assert len(swept.json()["jobs"]) == 1000


# -- against a real server: the event loop, memory, deadlines --------------------------------------

#: How long each hostile sender runs while ``/livez`` is probed.
PROBE_S = 2.0
#: ``/livez``'s median must stay well under the 100 ms of the issue; its worst, under this. The
#: worst is one probe that met a garbage collection or another process on this 2-core machine (the
#: suite runs beside other work); before the guard it was 5 to 13 s.
LIVEZ_MEDIAN_S = 0.05
LIVEZ_WORST_S = 1.0
#: How much the server's memory may grow while the bodies are refused: one 6.8 MiB body is held a
#: few times over while it is read and checked (uvicorn's buffer, its chunks and their join), and the
#: allocator keeps arenas for the worker threads (about 100 MiB seen); before the guard one body of
#: 600,000 keys added 720 MiB.
MEMORY_GROWTH_KIB = 256 * 1024


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _probe_livez_while(server: ServerProcess, send: Callable[[], httpx.Response]) -> dict[str, Any]:
    """Send ``send`` again and again for :data:`PROBE_S` while probing ``/livez`` every 50 ms."""
    answers: list[httpx.Response] = []
    stopping = threading.Event()

    def keep_sending() -> None:
        while not stopping.is_set():
            answers.append(send())

    sender = threading.Thread(target=keep_sending)
    baseline = _rss_kib(server.process.pid)
    peak = baseline
    latencies = []
    sender.start()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            end = time.monotonic() + PROBE_S
            while time.monotonic() < end or not answers:
                started = time.perf_counter()
                assert http.get("/livez").status_code == 200
                latencies.append(time.perf_counter() - started)
                peak = max(peak, _rss_kib(server.process.pid))
                time.sleep(0.05)
    finally:
        stopping.set()
        sender.join()
    return {"latencies": latencies, "answers": answers, "growth_kib": peak - baseline}


#: The deadlines of the module's server: short, so that the tests wait little.
BODY_TIMEOUT_S = 2
HEAD_TIMEOUT_S = 1


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    env = {"TILETUNE_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S), "TILETUNE_HEAD_TIMEOUT_S": str(HEAD_TIMEOUT_S)}
    process = start_server(tmp_path_factory.mktemp("bodies"), env=env)
    yield process
    stop(process.process)


def test_livez_answers_while_maximal_bodies_are_refused(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as http:
        made = http.post("/v1/tokens", json={"role": "reader", "name": "r"}, headers=ADMIN)
        reader = {"Authorization": f"Bearer {made.json()['token']}"}
    unknown_keys = _object_of(600_000)  # 6.8 MiB, as the outside probe sent it
    bad_report = {
        "kernel": 1,
        "shape": {f"d{i}": "x" for i in range(16)},
        "dtype": 1,
        "chip": 1,
        "count": "x",
    }
    invalid_reports = json.dumps({"misses": [bad_report] * 10_000}).encode()  # 210,000 errors
    cases = [
        ("a reader's 600,000 unknown keys", reader, unknown_keys, 413, "more than 1,000 keys"),
        ("no token's 600,000 unknown keys", {}, unknown_keys, 401, "needs a reader token"),
        ("a reader's 10,000 invalid reports", reader, invalid_reports, 422, "misses[0].kernel"),
    ]
    for label, headers, body, status, reason in cases:

        def send(headers: dict[str, str] = headers, body: bytes = body) -> httpx.Response:
            with httpx.Client(base_url=server.url, timeout=60) as sender:
                return sender.post("/v1/misses", content=body, headers={**JSON, **headers})

        seen = _probe_livez_while(server, send)
        latencies = seen["latencies"]
        summary = f"{label}: median {statistics.median(latencies):.3f} s, worst {max(latencies):.3f} s"
        assert statistics.median(latencies) < LIVEZ_MEDIAN_S, summary
        assert max(latencies) < LIVEZ_WORST_S, summary
        assert seen["growth_kib"] < MEMORY_GROWTH_KIB, (label, seen["growth_kib"])
        assert {(answer.status_code, reason in answer.text) for answer in seen["answers"]} == {(status, True)}


def _connect(server: ServerProcess) -> socket.socket:
    connection = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    connection.settimeout(10)
    return connection


def _answer_until_closed(connection: socket.socket) -> bytes:
    """What the server sends until it closes the connection (raises on the 10 s timeout)."""
    received = b""
    while chunk := connection.recv(65536):
        received += chunk
    return received


UNFINISHED = 50


def test_unfinished_bodies_are_answered_408_and_dropped_after_the_timeout(
    server: ServerProcess,
) -> None:
    head = (
        b"POST /v1/misses HTTP/1.1\r\nHost: tiletune\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000\r\n\r\n{"
    )
    connections = [_connect(server) for _ in range(UNFINISHED)]
    started = time.monotonic()
    for connection in connections:
        connection.sendall(head)
    trickler = connections[0]
    for _ in range(4):  # one keeps sending a byte at a time: the deadline is for the whole body
        time.sleep(0.3)
        trickler.sendall(b" ")
    answers = [_answer_until_closed(connection) for connection in connections]
    elapsed_s = time.monotonic() - started
    for connection in connections:
        connection.close()
    assert all(answer.startswith(b"HTTP/1.1 408 ") for answer in answers), answers[0][:200]
    assert b'"code":"body_timeout"' in answers[-1]
    assert BODY_TIMEOUT_S <= elapsed_s < BODY_TIMEOUT_S + 5, elapsed_s
    with httpx.Client(base_url=server.url) as http:
        assert http.get("/livez").status_code == 200


def test_connections_trickling_their_heads_are_closed_after_the_timeout(
    server: ServerProcess,
) -> None:
    connections = [_connect(server) for _ in range(20)]
    started = time.monotonic()
    closed: set[int] = set()
    while len(closed) < len(connections) and time.monotonic() - started < HEAD_TIMEOUT_S + 5:
        for index, connection in enumerate(connections):
            if index in closed:
                continue
            try:
                connection.sendall(b"X")  # never ends the request line
            except OSError:
                closed.add(index)
        time.sleep(0.2)
    elapsed_s = time.monotonic() - started
    for connection in connections:
        connection.close()
    assert len(closed) == len(connections)
    assert HEAD_TIMEOUT_S <= elapsed_s < HEAD_TIMEOUT_S + 5, elapsed_s
