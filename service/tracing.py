"""OpenTelemetry traces of the server: optional, off unless configured.

On when ``Settings.otel`` says so (``--otel``, ``$TILETUNE_OTEL``), or, with it unset, when
``$OTEL_EXPORTER_OTLP_ENDPOINT`` is set. Then :func:`instrument` traces, for the service
``tiletune-server`` (``$OTEL_SERVICE_NAME`` overrides):

- the app's requests (FastAPI: one server span per request, continuing a caller's
  ``traceparent``);
- the SQL of the app's engines (SQLAlchemy: one span per statement, under its request's span,
  also from the worker threads of sync endpoints; the SQL of background threads, such as the
  index's watcher and the reaper, starts no trace);
- the calls httpx makes in the process (one client span each, ``traceparent`` sent on).

Spans are exported as ``$OTEL_TRACES_EXPORTER`` says: ``otlp`` (the default; OTLP over HTTP to
``$OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, else ``$OTEL_EXPORTER_OTLP_ENDPOINT``, else the SDK's
``http://localhost:4318``, in batches), ``console`` (each span on stdout), or ``none`` (made,
not exported: a caller adds its own processor to :attr:`Tracing.provider`). Every request is
traced (a caller's ``traceparent`` that is not sampled is followed) unless ``$OTEL_TRACES_SAMPLER``
names a sampler of the SDK's.

The OpenTelemetry packages are imported here only when tracing is on, so a server without
them runs as ever; one asked to trace without them gets :class:`TracingUnavailableError`,
naming the extra to install (:data:`INSTALL_HINT`). SQLAlchemy's and httpx's instrumentation
is the process's: one traced app per process (a server); :meth:`Tracing.close` undoes it.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastapi import FastAPI
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.sampling import Sampler, SamplingResult
    from opentelemetry.trace import Link, SpanKind
    from opentelemetry.trace.span import TraceState
    from opentelemetry.util.types import Attributes
    from sqlalchemy.engine import Engine

    from tiletune.service.database import Database

log = logging.getLogger(__name__)

SERVICE_NAME = "tiletune-server"
ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
EXPORTER_ENV = "OTEL_TRACES_EXPORTER"
SERVICE_NAME_ENV = "OTEL_SERVICE_NAME"
SAMPLER_ENV = "OTEL_TRACES_SAMPLER"
EXPORTERS = ("otlp", "console", "none")
INSTALL_HINT = "pip install 'tiletune[otel]'"
#: What the ``otel`` extra brings, by the module each distribution provides.
PACKAGES = {
    "opentelemetry.sdk": "opentelemetry-sdk",
    "opentelemetry.exporter.otlp.proto.http": "opentelemetry-exporter-otlp-proto-http",
    "opentelemetry.instrumentation.fastapi": "opentelemetry-instrumentation-fastapi",
    "opentelemetry.instrumentation.sqlalchemy": "opentelemetry-instrumentation-sqlalchemy",
    "opentelemetry.instrumentation.httpx": "opentelemetry-instrumentation-httpx",
}


class TracingUnavailableError(RuntimeError):
    """Tracing is configured, but cannot run here (a package missing, an unknown exporter)."""


def add_otel_option(parser: argparse.ArgumentParser) -> None:
    """``--otel``: trace (``Settings.otel`` true)."""
    parser.add_argument(
        "--otel",
        action="store_true",
        help="trace requests, SQL and httpx calls with OpenTelemetry (the otel extra; default: "
        f"$TILETUNE_OTEL, else on when ${ENDPOINT_ENV} is set)",
    )


def tracing_wanted(otel: bool | None) -> bool:
    """Whether to trace: ``otel`` when set, else whether ``$OTEL_EXPORTER_OTLP_ENDPOINT`` is."""
    if otel is not None:
        return otel
    return bool(os.environ.get(ENDPOINT_ENV, "").strip())


def check_tracing(otel: bool | None) -> None:
    """:class:`TracingUnavailableError` if tracing is wanted but cannot run; else nothing."""
    if not tracing_wanted(otel):
        return
    import importlib

    missing = []
    for module, distribution in PACKAGES.items():
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(distribution)
    if missing:
        raise TracingUnavailableError(
            f"tracing is configured (--otel, $TILETUNE_OTEL or ${ENDPOINT_ENV}) but {', '.join(missing)} "
            f"is not installed: {INSTALL_HINT}"
        )
    _exporter_name()


def _exporter_name() -> str:
    name = os.environ.get(EXPORTER_ENV, "").strip().lower() or "otlp"
    if name not in EXPORTERS:
        raise TracingUnavailableError(f"${EXPORTER_ENV}={name!r} is not one of {', '.join(EXPORTERS)}")
    return name


@dataclass
class Tracing:
    """An app's tracing: its :attr:`provider`, and what :meth:`close` undoes."""

    provider: TracerProvider
    app: FastAPI

    def close(self) -> None:
        """Stop tracing: the app, SQLAlchemy and httpx uninstrumented; spans left exported."""
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
        from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
        from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor

        FastAPIInstrumentor.uninstrument_app(self.app)
        for instrumentor in (SQLAlchemyInstrumentor(), HTTPXClientInstrumentor()):
            if instrumentor.is_instrumented_by_opentelemetry:
                instrumentor.uninstrument()
        self.provider.shutdown()


def instrument(app: FastAPI, db: Database, otel: bool | None) -> Tracing | None:
    """Trace ``app``, the engines of ``db`` and httpx when :func:`tracing_wanted`; else None."""
    if not tracing_wanted(otel):
        return None
    check_tracing(otel)
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
    from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    name = os.environ.get(SERVICE_NAME_ENV, "").strip() or SERVICE_NAME
    sampler = None if os.environ.get(SAMPLER_ENV, "").strip() else _requests_sampler()
    provider = TracerProvider(resource=Resource.create({"service.name": name}), sampler=sampler)
    processor = _span_processor(_exporter_name())
    if processor is not None:
        provider.add_span_processor(processor)
    # The versions are the extra's to choose: their declared ranges lag the libraries (tested here).
    FastAPIInstrumentor.instrument_app(app, tracer_provider=provider, exclude_spans=["receive", "send"])
    options: dict[str, Any] = {"tracer_provider": provider, "skip_dep_check": True}
    SQLAlchemyInstrumentor().instrument(engines=list(_engines(db)), **options)
    HTTPXClientInstrumentor().instrument(**options)
    log.info("tracing as %s (exporter %s)", name, _exporter_name())
    return Tracing(provider, app)


def _engines(db: Database) -> Sequence[Engine]:
    """The distinct engines of ``db``'s writes and reads."""
    engines: list[Engine] = []
    for sessions in (db.sessions, db.reads):
        engine = sessions.kw["bind"]
        if all(engine is not seen for seen in engines):
            engines.append(engine)
    return engines


def _span_processor(exporter: str) -> SpanProcessor | None:
    """The processor of the named exporter (``none``: no processor)."""
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor

    if exporter == "none":
        return None
    if exporter == "console":
        return SimpleSpanProcessor(ConsoleSpanExporter())
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return BatchSpanProcessor(OTLPSpanExporter())


def _requests_sampler() -> Sampler:
    """Traces that start at a request (a server span); other spans follow their parent's choice."""
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased
    from opentelemetry.sdk.trace.sampling import Sampler as SdkSampler
    from opentelemetry.trace import SpanKind

    class RequestRoots(SdkSampler):
        """A root span is sampled when it is a server span: background SQL starts no trace."""

        def should_sample(  # noqa: PLR0917 (the SDK's signature)
            self,
            parent_context: Context | None,
            trace_id: int,
            name: str,
            kind: SpanKind | None = None,
            attributes: Attributes = None,
            links: Sequence[Link] | None = None,
            trace_state: TraceState | None = None,
        ) -> SamplingResult:
            chosen = ALWAYS_ON if kind is SpanKind.SERVER else ALWAYS_OFF
            return chosen.should_sample(parent_context, trace_id, name, kind, attributes, links, trace_state)

        def get_description(self) -> str:
            return "RequestRoots"

    return ParentBased(root=RequestRoots())
