"""The service's Prometheus metrics (``GET /metrics``), with the ``prometheus-client`` package.

One :class:`ServiceMetrics` per app, in a registry of its own (several apps in one process, as
in tests, never share counts). What it exposes, per replica:

- ``tiletune_request_seconds`` (histogram): request latency by route *template*
  (``/v1/jobs/{job_id}``, never the path as sent), method and status; requests that match no
  route are ``route="unmatched"``;
- ``tiletune_trials_total`` (counter): trial outcomes told, by outcome (``measured``,
  ``invalid``, ``failed``);
- ``tiletune_leases_expired_total`` and ``tiletune_jobs_requeued_total`` (counters): leases
  the reaper ended, and jobs that went back to the queue when their last lease ended;
- ``tiletune_job_run_seconds`` (histogram): submission to the end of a validated job;
  ``tiletune_job_queue_wait_seconds`` (histogram): submission to a job's first lease;
- ``tiletune_lookups_total`` (counter): single-key lookups by answer (``exact``, ``nearest``,
  ``default``, ``none``: not found);
- ``tiletune_client_answers_total`` (counter): the answers clients served themselves (their
  in-process caches and defaults, no server lookup), by answer (``exact``, ``nearest``,
  ``default``), as clients report them (``POST /v1/client-stats``); with the lookups, every
  launch of the clients that report;
- ``tiletune_clock_skew_seconds`` (gauge): how far the database's clock is ahead of this
  replica's (negative: behind), as :mod:`~tiletune.service.scheduling.store_clock` last measured it; the
  times the replica writes and compares are the database's all the same;
- the process's own: ``process_*`` (CPU seconds, resident and virtual memory, open file
  descriptors, start time), ``python_info`` and ``python_gc_*`` (``prometheus-client``'s process,
  platform and GC collectors, on the app's registry);
- the store's gauges, read from the database at each scrape: ``tiletune_jobs`` (by state),
  ``tiletune_workers_online`` (seen within the lease time), ``tiletune_best_configs``; with
  ``tiletune_store_gauges_exporter``: 1 when this scrape carries them, else 0.

Store gauges from one place. They describe the shared database, not the replica, so exactly one
replica exports them at a time and a sum over replicas counts each once (the counters and
histograms above are per replica and come from every one). On PostgreSQL the exporter is the
replica whose dedicated connection (opened at its first scrape, kept, in autocommit) holds the
session-level advisory lock :data:`STORE_GAUGES_LOCK_KEY` (taken with ``pg_try_advisory_lock``;
not the migrations' key). The others try again at each of their scrapes, so when the exporter
dies (its connection closes and PostgreSQL releases the lock) or stops (the app's shutdown
closes it), the next replica scraped takes over. A replica whose database cannot be reached
exports ``tiletune_store_gauges_exporter 0`` and its process's metrics, never a 5xx. On SQLite
there is one server: it always exports them.

Dashboards: sum the store gauges over replicas (or filter on ``tiletune_store_gauges_exporter
== 1``); ``sum(tiletune_store_gauges_exporter)`` is 1 while one replica exports them.

No label holds a shape, a config, a token or a name a caller chose: routes are templates, the
other labels closed vocabularies.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Iterator, Mapping
from datetime import datetime, timedelta

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import Connection, Engine, func, pool, select, text
from sqlalchemy.exc import SQLAlchemyError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tiletune.service import configs
from tiletune.service.database import Database, aware, is_sqlite, make_engine
from tiletune.service.models import WorkerRow
from tiletune.service.request_ids import RequestOutcome

log = logging.getLogger(__name__)

#: The answers a lookup is counted under.
LOOKUP_ANSWERS = ("exact", "nearest", "default", "none")

#: The answers a client's report counts.
CLIENT_ANSWERS = ("exact", "nearest", "default")

#: Job run times and queue waits span seconds to days.
JOB_SECONDS_BUCKETS = (1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 24 * 3600, float("inf"))

#: PostgreSQL advisory lock key held by the replica that exports the store's gauges ("ttgauges" in
#: ASCII; the migrations hold :data:`tiletune.service.migrate.MIGRATION_LOCK_KEY`).
STORE_GAUGES_LOCK_KEY = 0x7474676175676573

#: Seconds the exporter's dedicated connection may take to connect (a scrape must not hang).
STORE_LOCK_CONNECT_TIMEOUT_S = 3


class ServiceMetrics:
    """The app's metrics (see the module docstring); :meth:`exposition` is the ``/metrics`` body."""

    def __init__(self, db: Database, online_s: float, db_url: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self.requests = Histogram(
            "tiletune_request_seconds",
            "Request latency by route template, method and status",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.trials = Counter(
            "tiletune_trials", "Trial outcomes told, by outcome", ["outcome"], registry=self.registry
        )
        self.leases_expired = Counter(
            "tiletune_leases_expired", "Leases ended by the reaper", registry=self.registry
        )
        self.requeued = Counter(
            "tiletune_jobs_requeued",
            "Jobs back in the queue after their last lease ended",
            registry=self.registry,
        )
        self.job_run = Histogram(
            "tiletune_job_run_seconds",
            "Submission to the end of a validated job",
            buckets=JOB_SECONDS_BUCKETS,
            registry=self.registry,
        )
        self.queue_wait = Histogram(
            "tiletune_job_queue_wait_seconds",
            "Submission to a job's first lease",
            buckets=JOB_SECONDS_BUCKETS,
            registry=self.registry,
        )
        self.lookups = Counter(
            "tiletune_lookups", "Single-key lookups by answer", ["answer"], registry=self.registry
        )
        #: One child per answer, bound once: a lookup is counted without a label lookup.
        self._lookups_by_answer = {answer: self.lookups.labels(answer) for answer in LOOKUP_ANSWERS}
        self.client_answers = Counter(
            "tiletune_client_answers",
            "Answers clients served from their own caches and defaults, by answer, as they report them",
            ["answer"],
            registry=self.registry,
        )
        for answer in CLIENT_ANSWERS:  # every answer shows from the start, at 0
            self.client_answers.labels(answer)
        self.clock_skew = Gauge(
            "tiletune_clock_skew_seconds",
            "Seconds the database's clock is ahead of this replica's (negative: behind), as last measured",
            registry=self.registry,
        )
        self.store_lock = StoreGaugesLock(db_url)
        self.registry.register(_StoreCollector(db, online_s, self.store_lock))

    def lookup(self, answer: str) -> None:
        """Count one lookup answered ``exact``, ``nearest``, ``default`` or ``none``."""
        self._lookups_by_answer.get(answer, self._lookups_by_answer["none"]).inc()

    def clients_answered(self, counts: Mapping[str, int]) -> int:
        """Count a client's report: ``counts`` by answer (``exact``, ``nearest``, ``default``; any
        other key is not counted); the answers counted."""
        counted = 0
        for answer in CLIENT_ANSWERS:
            count = counts.get(answer, 0)
            if count > 0:
                self.client_answers.labels(answer).inc(count)
                counted += count
        return counted

    def job_done(self, created_at: datetime, finished_at: datetime) -> None:
        """Observe a validated job's run time."""
        self.job_run.observe(max(0.0, (aware(finished_at) - aware(created_at)).total_seconds()))

    def first_lease(self, created_at: datetime, leased_at: datetime) -> None:
        """Observe how long a job waited for its first lease."""
        self.queue_wait.observe(max(0.0, (aware(leased_at) - aware(created_at)).total_seconds()))

    def exposition(self) -> bytes:
        """The metrics in Prometheus' text format (reads the store: call it off the event loop)."""
        return generate_latest(self.registry)

    def close(self) -> None:
        """Give up exporting the store's gauges (the app's shutdown): another replica takes over."""
        self.store_lock.close()


class StoreGaugesLock:
    """Whether this replica exports the store's gauges (see the module docstring).

    :meth:`held` is True on SQLite; on PostgreSQL while this replica's dedicated connection holds
    the advisory lock :data:`STORE_GAUGES_LOCK_KEY`, which it tries to take when it does not.
    Thread-safe (scrapes run in worker threads); a database error makes it False for that call
    and drops the connection (the next call connects again).
    """

    def __init__(self, db_url: str) -> None:
        self._url = db_url
        self._postgres = not is_sqlite(db_url)
        self._engine: Engine | None = None
        self._connection: Connection | None = None
        self._held = False
        self._closed = False
        self._mutex = threading.Lock()

    def held(self) -> bool:
        """True when this replica exports the store's gauges now (may connect and try the lock)."""
        if not self._postgres:
            return True
        with self._mutex:
            if self._closed:
                return False
            if self._held and not self._still_connected():
                self._drop()  # the lock went with the connection: try for it again at once
            if not self._held:
                self._held = self._try_lock()
            return self._held

    def close(self) -> None:
        """Release the lock (close the dedicated connection); :meth:`held` is False from now on."""
        with self._mutex:
            self._closed = True
            self._drop()

    def _still_connected(self) -> bool:
        assert self._connection is not None
        try:
            self._connection.execute(text("SELECT 1"))
        except SQLAlchemyError:
            return False
        return True

    def _try_lock(self) -> bool:
        try:
            if self._connection is None:
                if self._engine is None:
                    self._engine = make_engine(
                        self._url,
                        poolclass=pool.NullPool,
                        isolation_level="AUTOCOMMIT",
                        connect_args={"connect_timeout": STORE_LOCK_CONNECT_TIMEOUT_S},
                    )
                self._connection = self._engine.connect()
            statement = text("SELECT pg_try_advisory_lock(:key)")
            return bool(self._connection.scalar(statement, {"key": STORE_GAUGES_LOCK_KEY}))
        except SQLAlchemyError as error:
            log.warning("cannot try the store gauges' lock: %s", type(error).__name__)
            self._drop()
            return False

    def _drop(self) -> None:
        self._held = False
        if self._connection is not None:
            with contextlib.suppress(SQLAlchemyError):  # a dead one: closing it was all there was to do
                self._connection.close()
            self._connection = None
        if self._closed and self._engine is not None:
            self._engine.dispose()
            self._engine = None


class _StoreCollector(Collector):
    """The store's gauges (jobs by state, workers online, best configs) on the exporting replica, read
    at each scrape; and ``tiletune_store_gauges_exporter`` on every replica."""

    def __init__(self, db: Database, online_s: float, lock: StoreGaugesLock) -> None:
        self.db = db
        self.online_s = online_s
        self.lock = lock

    def describe(self) -> Iterator[GaugeMetricFamily]:
        """The families, without reading the store (the registry's check for duplicate names)."""
        yield from self._families(({}, 0, 0))

    def collect(self) -> Iterator[GaugeMetricFamily]:
        counts = None
        if self.lock.held():
            try:
                counts = self._read()
            except SQLAlchemyError as error:
                log.warning("cannot read the store's gauges: %s", type(error).__name__)
        yield from self._families(counts)

    def _read(self) -> tuple[dict[str, int], int, int]:
        """Jobs by state, workers online and best configs, as the store has them now."""
        since = self.db.clock() - timedelta(seconds=self.online_s)
        with self.db.read() as session:
            counts = configs.counts(session)
            online = session.scalar(select(func.count()).where(WorkerRow.last_seen_at >= since)) or 0
        return counts["jobs"], online, counts["best_configs"]

    @staticmethod
    def _families(counts: tuple[dict[str, int], int, int] | None) -> Iterator[GaugeMetricFamily]:
        """The gauges of ``counts`` (none when ``None``: not the exporter), then the exporter's flag."""
        if counts is not None:
            jobs_by_state, online, best_configs = counts
            jobs = GaugeMetricFamily("tiletune_jobs", "Jobs by state", labels=["state"])
            for state, count in sorted(jobs_by_state.items()):
                jobs.add_metric([state], count)
            yield jobs
            yield GaugeMetricFamily(
                "tiletune_workers_online", "Workers seen within the lease time", value=online
            )
            yield GaugeMetricFamily("tiletune_best_configs", "Best configs stored", value=best_configs)
        yield GaugeMetricFamily(
            "tiletune_store_gauges_exporter",
            "1 when this replica's scrape carries the store's gauges (one replica at a time), else 0",
            value=0 if counts is None else 1,
        )


class RequestTimer:
    """Pure ASGI middleware: every HTTP request's latency into ``tiletune_request_seconds``.

    The route label is the matched route's template (Starlette sets ``scope["route"]``), so no
    path parameter (an id, a lease token) or query string reaches a label. A request whose client
    went away before its answer is status 499
    (:class:`~tiletune.service.request_ids.RequestOutcome`), never a 500.
    """

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        outcome = RequestOutcome(receive)

        async def timed_send(message: Message) -> None:
            outcome.saw(message)
            await send(message)

        try:
            await self.app(scope, outcome.receive, timed_send)
        except asyncio.CancelledError:
            outcome.went_away()
            raise
        finally:
            status = outcome.status
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            self.metrics.requests.labels(route, scope["method"], str(status)).observe(
                time.perf_counter() - started
            )
