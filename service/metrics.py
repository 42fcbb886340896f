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
- read from the store at each scrape: ``tiletune_jobs`` (gauge, by state),
  ``tiletune_workers_online`` (seen within the lease time), ``tiletune_best_configs``.

No label holds a shape, a config, a token or a name a caller chose: routes are templates, the
other labels closed vocabularies.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from datetime import datetime, timedelta

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tiletune.service import configs
from tiletune.service.database import Database, aware
from tiletune.service.models import WorkerRow

#: The answers a lookup is counted under.
LOOKUP_ANSWERS = ("exact", "nearest", "default", "none")

#: The answers a client's report counts.
CLIENT_ANSWERS = ("exact", "nearest", "default")

#: Job run times and queue waits span seconds to days.
JOB_SECONDS_BUCKETS = (1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 24 * 3600, float("inf"))


class ServiceMetrics:
    """The app's metrics (see the module docstring); :meth:`exposition` is the ``/metrics`` body."""

    def __init__(self, db: Database, online_s: float) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
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
        self.registry.register(_StoreCollector(db, online_s))

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


class _StoreCollector(Collector):
    """Gauges read from the store at each scrape: jobs by state, workers online, best configs."""

    def __init__(self, db: Database, online_s: float) -> None:
        self.db = db
        self.online_s = online_s

    def collect(self) -> Iterator[GaugeMetricFamily]:
        since = self.db.clock() - timedelta(seconds=self.online_s)
        with self.db.read() as session:
            counts = configs.counts(session)
            online = session.scalar(select(func.count()).where(WorkerRow.last_seen_at >= since)) or 0
        jobs = GaugeMetricFamily("tiletune_jobs", "Jobs by state", labels=["state"])
        for state, count in sorted(counts["jobs"].items()):
            jobs.add_metric([state], count)
        yield jobs
        yield GaugeMetricFamily("tiletune_workers_online", "Workers seen within the lease time", value=online)
        yield GaugeMetricFamily("tiletune_best_configs", "Best configs stored", value=counts["best_configs"])


class RequestTimer:
    """Pure ASGI middleware: every HTTP request's latency into ``tiletune_request_seconds``.

    The route label is the matched route's template (Starlette sets ``scope["route"]``), so no
    path parameter (an id, a lease token) or query string reaches a label.
    """

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def timed_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, timed_send)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            self.metrics.requests.labels(route, scope["method"], str(status)).observe(
                time.perf_counter() - started
            )
