"""The operator's view of a server: process metrics, the store's gauges from one replica, readiness.

Two real ``tiletune server`` processes share one PostgreSQL database: each scrape of ``/metrics``
carries the process's own metrics, and the store's gauges come from exactly one of them (the
holder of their advisory lock) until it dies and the other takes over. ``/readyz`` (and
``/healthz``, its older name) answers from a ``SELECT 1``: 200 while the database answers, 503
``database_unavailable`` while it refuses connections, and reads no table.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine, event, text

from tests.credentials import ADMIN, ADMIN_SECRET
from tests.service.conftest import POSTGRES_ADMIN_URL, postgres_database
from tests.service.processes import ServerProcess, kill, start_server, stop
from tiletune.service.app import create_app
from tiletune.service.database import normalize_url
from tiletune.service.migrate import upgrade
from tiletune.service.settings import Settings

CHIP: dict[str, Any] = {"name": "cpu/Ops Metrics Chip/2c", "kind": "cpu", "local_memory_bytes": 1 << 20}
#: The gauges that describe the shared store (one copy across replicas).
STORE_GAUGES = ("tiletune_jobs", "tiletune_workers_online", "tiletune_best_configs")
EXPORTER = "tiletune_store_gauges_exporter"
#: Scrapes a surviving replica may take to export the store's gauges after the exporter died.
TAKEOVER_SCRAPES = 20

Samples = dict[str, dict[tuple[tuple[str, str], ...], float]]


def scrape(url: str) -> Samples:
    """Every sample of ``url``'s ``/metrics`` (with a token), by name then labels."""
    response = httpx.get(f"{url}/metrics", headers=ADMIN, timeout=10)
    assert response.status_code == 200, response.text
    return scraped(response.text)


def scraped(exposition: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def seed(url: str) -> None:
    """A registered worker, a sweep of two jobs and a lookup, through the API."""
    with httpx.Client(base_url=url, headers=ADMIN, timeout=10) as http:
        worker = {"name": "w", "chip": CHIP, "backends": ["torch"], "software": {"torch": "2.13.0"}}
        assert http.post("/v1/workers", json=worker).status_code == 201
        sweep = {"kernel": "add", "shapes": [{"n": 4096}, {"n": 8192}], "dtypes": ["float32"], "trials": 3}
        assert http.post("/v1/sweeps", json=sweep).status_code == 201
        lookup = {"shape": "n=4096", "chip": CHIP["name"], "dtype": "float32"}
        assert http.get("/v1/configs/add", params=lookup).status_code == 200


@pytest.fixture
def two_servers(tmp_path: Path) -> Iterator[list[ServerProcess]]:
    """Two ``tiletune server`` processes on one fresh PostgreSQL database, started at once (their
    migrations take turns under the migrations' lock)."""
    with postgres_database() as url, ThreadPoolExecutor(2) as pool:
        starts = [pool.submit(start_server, tmp_path, db_url=url, log_name=f"server-{n}.log") for n in (1, 2)]
        servers: list[ServerProcess] = []
        try:
            servers += [start.result() for start in starts]
            yield servers
        finally:
            for start in starts:
                if start.exception() is None:
                    stop(start.result().process)


def test_two_replicas_export_process_metrics_and_one_copy_of_the_store_gauges(
    two_servers: list[ServerProcess],
) -> None:
    seed(two_servers[0].url)
    scrapes = [scrape(server.url) for server in two_servers]

    for samples in scrapes:
        assert samples["process_cpu_seconds_total"][()] > 0
        assert samples["process_resident_memory_bytes"][()] > 0
        assert "python_info" in samples
        assert "python_gc_collections_total" in samples
        assert "tiletune_request_seconds_count" in samples  # per replica: on both
    assert sorted(samples[EXPORTER][()] for samples in scrapes) == [0, 1]
    exporter = 0 if scrapes[0][EXPORTER][()] == 1 else 1
    for name in STORE_GAUGES:
        assert [name in samples for samples in scrapes].count(True) == 1, name
        assert name in scrapes[exporter]
    assert scrapes[exporter]["tiletune_jobs"] == {(("state", "queued"),): 2}
    assert scrapes[exporter]["tiletune_workers_online"][()] == 1
    assert sum(samples["tiletune_lookups_total"][(("answer", "default"),)] for samples in scrapes) == 1

    kill(two_servers[exporter].process)  # SIGKILL: no shutdown; the lock goes with its connection
    survivor = two_servers[1 - exporter]
    for _ in range(TAKEOVER_SCRAPES):
        samples = scrape(survivor.url)
        if samples[EXPORTER][()] == 1:
            break
        time.sleep(0.25)
    else:
        raise AssertionError(f"the surviving replica never took over:\n{survivor.log()}")
    assert samples["tiletune_jobs"] == {(("state", "queued"),): 2}
    assert samples["tiletune_best_configs"][()] == 0


def test_a_replica_that_shuts_down_hands_the_store_gauges_over_at_once() -> None:
    with postgres_database() as url:
        upgrade(url)
        settings = Settings(db_url=url, admin_token=ADMIN_SECRET)
        with TestClient(create_app(settings, reaper=False), headers=ADMIN) as other:
            with TestClient(create_app(settings, reaper=False), headers=ADMIN) as first:
                assert scraped(first.get("/metrics").text)[EXPORTER][()] == 1
                assert scraped(other.get("/metrics").text)[EXPORTER][()] == 0
            # the first app's shutdown released the lock: the next scrape of the other takes over
            taken_over = scraped(other.get("/metrics").text)
            assert taken_over[EXPORTER][()] == 1
            assert taken_over["tiletune_best_configs"][()] == 0


def test_two_apps_in_one_process_each_have_their_process_metrics(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 't.db'}"
    upgrade(url)
    settings = Settings(db_url=url, admin_token=ADMIN_SECRET)
    with (
        TestClient(create_app(settings, reaper=False), headers=ADMIN) as one,
        TestClient(create_app(settings, reaper=False), headers=ADMIN) as other,
    ):
        for client in (one, other):
            samples = scraped(client.get("/metrics").text)
            assert samples["process_cpu_seconds_total"][()] > 0
            assert samples[EXPORTER][()] == 1  # SQLite: one server, always the exporter
            assert samples["tiletune_best_configs"][()] == 0


def test_readiness_answers_from_select_1_and_503_while_the_database_refuses() -> None:
    admin = create_engine(normalize_url(POSTGRES_ADMIN_URL), isolation_level="AUTOCOMMIT")
    with postgres_database() as url:
        upgrade(url)
        name = url.rsplit("/", 1)[1]
        app = create_app(Settings(db_url=url, admin_token=ADMIN_SECRET), reaper=False)
        statements: list[str] = []
        engine = app.state.services.db.reads.kw["bind"]
        event.listen(engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
        with TestClient(app, headers=ADMIN) as client:
            statements.clear()
            for probe in ("/readyz", "/healthz"):
                answer = client.get(probe)
                assert (answer.status_code, answer.json()) == (200, {"status": "ok"})
            assert statements, "the probes ran their SELECT 1"
            assert not [statement for statement in statements if "jobs" in statement.lower()]
            assert scraped(client.get("/metrics").text)[EXPORTER][()] == 1
            try:
                with admin.connect() as connection:
                    connection.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false'))
                    connection.execute(
                        text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :name"),
                        {"name": name},
                    )
                for probe in ("/readyz", "/healthz"):
                    down = client.get(probe)
                    assert (down.status_code, down.json()["code"]) == (503, "database_unavailable")
                    assert int(down.headers["Retry-After"]) >= 1
                assert client.get("/livez").status_code == 200
                metrics = client.get("/metrics")  # the process's metrics still come, the store's not
                assert metrics.status_code == 200
                samples = scraped(metrics.text)
                assert samples[EXPORTER][()] == 0
                assert "process_cpu_seconds_total" in samples
                assert "tiletune_jobs" not in samples
            finally:
                with admin.connect() as connection:
                    connection.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true'))
            assert client.get("/readyz").status_code == 200
            assert scraped(client.get("/metrics").text)[EXPORTER][()] == 1
    admin.dispose()
