"""OpenTelemetry traces (the ``otel`` extra), in-process: the app through Starlette's test client.

Configured (``Settings.otel``), a request makes a FastAPI server span and the SQL it runs,
in the worker thread of its sync endpoint, SQLAlchemy spans under it, for the service
``tiletune-server``; SQL outside a request starts no trace; unconfigured, nothing is
instrumented and no span is made. A server asked to trace with an unknown exporter, or
without the packages, refuses to start, naming the fix.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from sqlalchemy import text

from tests.credentials import ADMIN, ADMIN_SECRET
from tests.service.processes import SERVER_TILETUNE, environment, free_port, run_cli
from tiletune.service.app import create_app
from tiletune.service.migrate import upgrade
from tiletune.service.settings import Settings
from tiletune.service.tracing import SERVICE_NAME, Tracing, tracing_wanted

FASTAPI_SCOPE = "opentelemetry.instrumentation.fastapi"
SQLALCHEMY_SCOPE = "opentelemetry.instrumentation.sqlalchemy"


@pytest.fixture
def database(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 't.db'}"
    upgrade(url)
    return url


@pytest.fixture
def traced(
    database: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[TestClient, InMemorySpanExporter]]:
    """A traced app (no exporter of its own: ``OTEL_TRACES_EXPORTER=none``) and its spans, kept in memory."""
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    app = create_app(Settings(db_url=database, admin_token=ADMIN_SECRET, otel=True), reaper=False)
    tracing = app.state.tracing
    assert isinstance(tracing, Tracing)
    spans = InMemorySpanExporter()
    tracing.provider.add_span_processor(SimpleSpanProcessor(spans))
    try:
        with TestClient(app, headers=ADMIN) as client:
            yield client, spans
    finally:
        tracing.close()


def test_a_request_is_a_server_span_with_its_sql_under_it(
    traced: tuple[TestClient, InMemorySpanExporter],
) -> None:
    client, spans = traced
    spans.clear()
    answer = client.get("/v1/sweeps", headers={"X-Request-ID": "traced-1"})
    assert answer.status_code == 200, answer.text
    finished = spans.get_finished_spans()
    (server,) = [span for span in finished if _scope(span) == FASTAPI_SCOPE]
    assert server.kind is SpanKind.SERVER
    assert server.name == "GET /v1/sweeps"
    assert server.resource.attributes["service.name"] == SERVICE_NAME
    sql = [span for span in finished if _scope(span) == SQLALCHEMY_SCOPE and span.name.startswith("SELECT")]
    assert sql, [span.name for span in finished]
    assert server.context is not None
    for span in sql:
        assert span.parent is not None
        assert span.parent.span_id == server.context.span_id
        assert span.context is not None
        assert span.context.trace_id == server.context.trace_id
    assert answer.headers["X-Request-ID"] == "traced-1"  # the request id's middleware still runs


def test_sql_outside_a_request_starts_no_trace(traced: tuple[TestClient, InMemorySpanExporter]) -> None:
    client, spans = traced
    db = client.app.state.services.db  # type: ignore[attr-defined]
    spans.clear()
    with db.read() as session:  # as the index's watcher and the reaper read, in threads of their own
        assert session.scalar(text("SELECT 1")) == 1
    assert spans.get_finished_spans() == ()


def test_without_configuration_nothing_is_traced(database: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("TILETUNE_OTEL", raising=False)
    assert not tracing_wanted(None)
    app = create_app(Settings(db_url=database, admin_token=ADMIN_SECRET), reaper=False)
    assert app.state.tracing is None
    with TestClient(app, headers=ADMIN) as client:
        assert client.get("/v1/sweeps").status_code == 200
    assert not hasattr(app, "_original_build_middleware_stack")  # the FastAPI instrumentor's mark
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
    from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor

    assert not SQLAlchemyInstrumentor().is_instrumented_by_opentelemetry
    assert not HTTPXClientInstrumentor().is_instrumented_by_opentelemetry


def test_the_environment_turns_tracing_on_and_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    assert tracing_wanted(None)
    assert not tracing_wanted(False)  # TILETUNE_OTEL=0 wins over the endpoint
    monkeypatch.setenv("TILETUNE_OTEL", "0")
    assert Settings().otel is False
    monkeypatch.setenv("TILETUNE_OTEL", "1")
    assert Settings().otel is True
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT")
    assert not tracing_wanted(None)


def test_a_server_asked_to_trace_with_an_unknown_exporter_refuses_to_start(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    done = run_cli(
        "server", "--db", f"sqlite:///{db}", "--port", str(free_port()), "--otel",
        env={"OTEL_TRACES_EXPORTER": "zipkin"},
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "$OTEL_TRACES_EXPORTER='zipkin' is not one of otlp, console, none" in done.stderr
    assert not db.exists()


def test_a_server_asked_to_trace_without_the_packages_names_the_extra(tmp_path: Path) -> None:
    """The server's own install (the ``server`` extra alone) has no OpenTelemetry SDK."""
    db = tmp_path / "t.db"
    done = subprocess.run(
        [SERVER_TILETUNE, "server", "--db", f"sqlite:///{db}", "--port", str(free_port())],
        capture_output=True,
        text=True,
        env=environment({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}),
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "opentelemetry-sdk" in done.stderr
    assert "pip install 'tiletune[otel]'" in done.stderr
    assert not db.exists()


def _scope(span: ReadableSpan) -> str | None:
    scope = span.instrumentation_scope
    return scope.name if scope is not None else None
