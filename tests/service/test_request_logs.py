"""Request ids and the server's log lines, from real ``tiletune server`` processes.

A request's ``X-Request-ID`` (when sane) is echoed, else one is made; the request's access line
and every line logged while handling it (here: a sweep's submission, logged in the worker
thread of its sync endpoint) carry it, as JSON (``--log-format json``) or text (the default).
The access line has the path without its query; no line holds the bearer token. A bad level or
format is refused naming the setting. The JSON and text formats, the redaction of a bearer
credential and the answer to an unhandled error are checked in-process too.
"""

from __future__ import annotations

import io
import json
import logging
import re
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tests.credentials import ADMIN, ADMIN_SECRET, ADMIN_TOKEN
from tests.service.processes import (
    FAST_LEASES,
    SERVER_TILETUNE,
    START_TIMEOUT_S,
    ServerProcess,
    free_port,
    run_cli,
    spawn,
    stop,
    wait_for_health,
)
from tiletune.client import calls
from tiletune.client.api import ServiceApi
from tiletune.service.app import create_app
from tiletune.service.logs import JsonFormatter, LogSettingError, TextFormatter, configure_logging, log_level
from tiletune.service.migrate import upgrade
from tiletune.service.request_ids import RequestIdFilter
from tiletune.service.settings import Settings

SWEEP = {"kernel": "add", "shapes": [{"n": 4096}], "dtypes": ["float32"], "chips": ["*"]}
GENERATED_ID = re.compile(r"[0-9a-f]{32}")
#: How long a line may take to reach the server's log file after its answer.
LOG_WAIT_S = 10.0


def spawn_server(folder: Path, *args: str, env: dict[str, str] | None = None) -> ServerProcess:
    """``tiletune server ARGS`` (the torch-free install's) on a fresh SQLite file, starting."""
    port, db_url, log_path = free_port(), f"sqlite:///{folder / 't.db'}", folder / "server.log"
    command = ["server", "--db", db_url, "--port", str(port), *args]
    process = spawn(command, log_path, {**FAST_LEASES, **(env or {})}, SERVER_TILETUNE)
    url = f"http://127.0.0.1:{port}"
    return ServerProcess(url=url, port=port, db_url=db_url, process=process, log_path=log_path)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ServerProcess]]:
    """A server logging JSON (``--log-format json``) and one logging text (the default), started at once."""
    started = {
        "json": spawn_server(tmp_path_factory.mktemp("json"), "--log-format", "json"),
        "text": spawn_server(tmp_path_factory.mktemp("text"), env={"TILETUNE_LOG_LEVEL": "info"}),
    }
    try:
        for server in started.values():
            wait_for_health(server.url, server.process, server.log_path, START_TIMEOUT_S)
        yield started
    finally:
        for server in started.values():
            stop(server.process)


@pytest.fixture
def json_server(servers: dict[str, ServerProcess]) -> ServerProcess:
    return servers["json"]


@pytest.fixture
def text_server(servers: dict[str, ServerProcess]) -> ServerProcess:
    return servers["text"]


def json_lines(server: ServerProcess) -> list[dict[str, Any]]:
    """The server's JSON log lines (the lines it prints on stdout are not log lines)."""
    lines = server.log_path.read_text().splitlines()
    return [json.loads(line) for line in lines if not line.startswith("tiletune server:")]


def wait_for(found: Callable[[], list[Any]], server: ServerProcess) -> list[Any]:
    """What ``found`` returns once it is not empty (a line reaches the file after its answer)."""
    deadline = time.monotonic() + LOG_WAIT_S
    while time.monotonic() < deadline:
        result = found()
        if result:
            return result
        time.sleep(0.05)
    raise AssertionError(f"not in the server's log within {LOG_WAIT_S:g} s:\n{server.log(60)}")


def lines_of(server: ServerProcess, request_id: str) -> list[dict[str, Any]]:
    """The JSON lines of one request, once its access line is written."""

    def access() -> list[dict[str, Any]]:
        of_request = [line for line in json_lines(server) if line.get("request_id") == request_id]
        return of_request if any(line["logger"] == "tiletune.access" for line in of_request) else []

    return wait_for(access, server)


def test_a_given_id_is_echoed_and_in_every_json_line_of_its_request(json_server: ServerProcess) -> None:
    answer = httpx.post(
        f"{json_server.url}/v1/sweeps?dry=1", json=SWEEP, headers={**ADMIN, "X-Request-ID": "abc-123"}
    )
    assert answer.status_code == 201, answer.text
    assert answer.headers["X-Request-ID"] == "abc-123"
    lines = lines_of(json_server, "abc-123")
    (access,) = [line for line in lines if line["logger"] == "tiletune.access"]
    assert access["level"] == "INFO"
    assert (access["method"], access["path"], access["status"]) == ("POST", "/v1/sweeps", 201)
    assert access["duration_ms"] >= 0
    assert access["client"].startswith("127.0.0.1:")
    assert access["message"] == f'{access["client"]} - "POST /v1/sweeps" 201 {access["duration_ms"]:.1f} ms'
    # logged in the endpoint's worker thread: the request's context reached it
    (submitted,) = [line for line in lines if line["logger"] == "tiletune.service.api_sweeps"]
    assert re.fullmatch(r"sweep \d+ submitted by token \d+: 1 queued", submitted["message"])
    stamp = datetime.fromisoformat(access["ts"].replace("Z", "+00:00"))
    assert stamp.utcoffset() is not None
    assert stamp.utcoffset() == UTC.utcoffset(None)
    assert abs((datetime.now(UTC) - stamp).total_seconds()) < 120
    every = json_lines(json_server)
    assert all({"ts", "level", "logger", "message"} <= line.keys() for line in every)
    assert any(line["logger"] == "uvicorn.error" for line in every)  # uvicorn's lines are ours too
    assert not any(line["logger"] == "uvicorn.access" for line in every)  # its access log is off
    text = json_server.log_path.read_text()
    assert "dry=1" not in text
    assert ADMIN_TOKEN not in text


@pytest.mark.parametrize("sent", [None, "x" * 129, "bad id!", "ab/../c", ""])
def test_a_missing_or_odd_id_is_replaced_by_a_new_one(json_server: ServerProcess, sent: str | None) -> None:
    headers = {"X-Request-ID": sent} if sent is not None else {}
    answer = httpx.get(f"{json_server.url}/v1/sweeps", headers={**ADMIN, **headers})
    assert answer.status_code == 200, answer.text
    made = answer.headers["X-Request-ID"]
    assert GENERATED_ID.fullmatch(made), made
    (access,) = [line for line in lines_of(json_server, made) if line["logger"] == "tiletune.access"]
    assert (access["method"], access["path"], access["status"]) == ("GET", "/v1/sweeps", 200)
    if sent:
        assert sent not in json_server.log_path.read_text()


def test_the_longest_sane_id_is_kept(json_server: ServerProcess) -> None:
    sent = "A-z_0.9" * 18 + "xx"  # 128 characters
    answer = httpx.get(f"{json_server.url}/healthz", headers={"X-Request-ID": sent})
    assert answer.headers["X-Request-ID"] == sent
    assert lines_of(json_server, sent)


def test_a_refused_token_has_its_id_and_status_in_the_access_line(json_server: ServerProcess) -> None:
    answer = httpx.get(
        f"{json_server.url}/v1/sweeps",
        headers={
            "Authorization": "Bearer tt_not-a-token-of-this-server-0123456789abc",
            "X-Request-ID": "r-401",
        },
    )
    assert answer.status_code == 401
    assert answer.headers["X-Request-ID"] == "r-401"
    (access,) = [line for line in lines_of(json_server, "r-401") if line["logger"] == "tiletune.access"]
    assert access["status"] == 401
    assert "tt_not-a-token-of-this-server" not in json_server.log_path.read_text()


def test_each_call_of_the_client_sends_a_fresh_id_the_server_logs(json_server: ServerProcess) -> None:
    sent: list[str] = []

    def keep_id(response: httpx.Response) -> None:
        assert response.headers["X-Request-ID"] == response.request.headers["X-Request-ID"]
        sent.append(response.request.headers["X-Request-ID"])

    hooks = {"response": [keep_id]}
    with ServiceApi(http=httpx.Client(base_url=json_server.url, headers=ADMIN, event_hooks=hooks)) as api:
        api.send(calls.tokens())
        api.send(calls.jobs(limit=1))
    assert len(sent) == 2
    assert len(set(sent)) == 2
    assert all(GENERATED_ID.fullmatch(each) for each in sent)
    for each in sent:
        assert lines_of(json_server, each)


def test_text_lines_end_with_the_request_id(text_server: ServerProcess) -> None:
    answer = httpx.post(f"{text_server.url}/v1/sweeps", json=SWEEP, headers={**ADMIN, "X-Request-ID": "t-1"})
    assert answer.status_code == 201, answer.text
    assert answer.headers["X-Request-ID"] == "t-1"
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"
    access = re.compile(
        rf'{stamp} INFO tiletune\.access: 127\.0\.0\.1:\d+ - "POST /v1/sweeps" 201 [\d.]+ ms request_id=t-1'
    )
    submitted = re.compile(
        rf"{stamp} INFO tiletune\.service\.api_sweeps: sweep \d+ submitted .* request_id=t-1"
    )

    def both() -> list[str]:
        lines = text_server.log_path.read_text().splitlines()
        found = [line for line in lines if access.fullmatch(line) or submitted.fullmatch(line)]
        return found if len(found) == 2 else []

    wait_for(both, text_server)
    lines = text_server.log_path.read_text().splitlines()
    started = re.compile(rf"{stamp} INFO uvicorn\.error: Application startup complete\.")
    assert any(started.fullmatch(line) for line in lines)
    assert not any(line.startswith("{") for line in lines)


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (
            ["--log-level", "LOUD"],
            {},
            "log_level: 'LOUD' is not one of DEBUG, INFO, WARNING, ERROR, CRITICAL",
        ),
        ([], {"TILETUNE_LOG_FORMAT": "xml"}, "log_format: 'xml' is not one of text, json (from $TILETUNE_"),
    ],
)
def test_a_bad_level_or_format_is_refused_naming_it(
    tmp_path: Path, args: list[str], env: dict[str, str], named: str
) -> None:
    db = tmp_path / "t.db"
    done = run_cli("server", "--db", f"sqlite:///{db}", "--port", str(free_port()), *args, env=env)
    assert done.returncode == 2, done.stderr
    assert named in done.stderr
    assert not db.exists()  # refused before the database was touched


# -- in-process: the formats, redaction, an unhandled error -----------------------------------------


def test_the_json_format_writes_exceptions_and_redacts_bearer_credentials() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RequestIdFilter())
    logger = logging.getLogger("tests.request_logs.json")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        raise ValueError("the reason")
    except ValueError:
        logger.exception("refused Authorization: Bearer %s", ADMIN_TOKEN)
    finally:
        logger.removeHandler(handler)
    (line,) = [json.loads(each) for each in stream.getvalue().splitlines()]
    assert line["level"] == "ERROR"
    assert line["logger"] == "tests.request_logs.json"
    assert line["message"] == "refused Authorization: Bearer [redacted]"
    assert "request_id" not in line  # logged outside any request
    assert line["exception"].startswith("Traceback")
    assert "ValueError: the reason" in line["exception"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", line["ts"])
    text = TextFormatter("%(levelname)s %(message)s")
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "Bearer %s", (ADMIN_TOKEN,), None)
    record.request_id = "abc"
    assert text.format(record) == "INFO Bearer [redacted] request_id=abc"


def test_a_bad_level_from_the_environment_names_where_it_came_from(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TILETUNE_LOG_LEVEL", "chatty")
    with pytest.raises(LogSettingError, match=r"'chatty' is not one of .* \(from \$TILETUNE_LOG_LEVEL\)"):
        configure_logging()
    assert log_level("debug") == logging.DEBUG
    monkeypatch.setenv("TILETUNE_LOG_LEVEL", "warning")
    assert log_level() == logging.WARNING


def test_an_unhandled_error_answers_and_logs_with_the_request_id(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"sqlite:///{tmp_path / 't.db'}"
    upgrade(url)
    app: FastAPI = create_app(Settings(db_url=url, admin_token=ADMIN_SECRET), reaper=False)

    def broken() -> None:
        raise RuntimeError("a bug")

    app.add_api_route("/broken", broken)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RequestIdFilter())
    caplog.set_level(logging.INFO)
    # An in-process `tiletune up` earlier in the run quiets the access lines; this test wants them.
    caplog.set_level(logging.INFO, logger="tiletune.access")
    logging.getLogger().addHandler(handler)
    try:
        with TestClient(app, raise_server_exceptions=False) as client:
            answer = client.get("/broken?secret=1", headers={"X-Request-ID": "boom-1"})
    finally:
        logging.getLogger().removeHandler(handler)
    assert answer.status_code == 500
    assert answer.json()["code"] == "internal_error"
    assert answer.headers["X-Request-ID"] == "boom-1"
    lines = [json.loads(each) for each in stream.getvalue().splitlines()]
    (access,) = [line for line in lines if line["logger"] == "tiletune.access"]
    assert (access["path"], access["status"], access["request_id"]) == ("/broken", 500, "boom-1")
