"""The answers clients serve themselves, reported to the real server and counted in its ``/metrics``.

The clients (sync and async) run against the app of ``conftest.server`` (uvicorn on a thread,
SQLite); an older server is that app with ``POST /v1/client-stats`` taken out of its routes.
The route's own contract (auth, bad bodies, the rate limit) is checked in process.
"""

from __future__ import annotations

import itertools
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import APIRouter, FastAPI
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from starlette.routing import Match

from tests.credentials import ADMIN, ADMIN_SECRET, ADMIN_TOKEN
from tiletune.client import AsyncConfigClient, ClientSettings, ConfigClient
from tiletune.client.wire import MAX_REPORTED_ANSWERS
from tiletune.kernels import client_settings
from tiletune.service import api_misses
from tiletune.service.access.ratelimit import RateLimiter
from tiletune.service.app import create_app
from tiletune.service.migrate import upgrade
from tiletune.service.settings import Settings

from .conftest import CHIP, LiveServer, free_port

ADD_CONFIG = {"tile_size": 4096, "buffer_num": 2, "pipeline_depth": 2}
TUNED = {"n": 65536}
NEAR = {"n": 131072}
ROUTE = "/v1/client-stats"


class CountingTransport(httpx.HTTPTransport):
    """httpx's real transport, recording the path of every request that went out."""

    def __init__(self) -> None:
        super().__init__()
        self.paths: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        return super().handle_request(request)


class RecordingASGITransport(httpx.ASGITransport):
    """httpx's ASGI transport to ``app``, recording the path of every request that went out."""

    def __init__(self, app: FastAPI) -> None:
        super().__init__(app=app)
        self.paths: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        return await super().handle_async_request(request)


def settings(tmp_path: Path, **overrides: object) -> ClientSettings:
    values: dict[str, object] = {"cache_dir": tmp_path / "cache", "timeout_s": 2.0, "miss_flush_s": 3600.0}
    values.update(overrides)
    return client_settings(**values)


def samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``GET /metrics``, parsed from the exposition text."""
    response = httpx.get(f"{url}/metrics")
    assert response.status_code == 200
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def client_answers(url: str) -> dict[str, float]:
    """``tiletune_client_answers_total`` by answer."""
    return {
        dict(labels)["answer"]: value
        for (name, labels), value in samples(url).items()
        if name == "tiletune_client_answers_total"
    }


def served(exact: int = 0, nearest: int = 0, default: int = 0) -> dict[str, float]:
    return {"exact": exact, "nearest": nearest, "default": default}


def wait_for(condition: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def without_the_route(app: FastAPI) -> None:
    """Take ``POST /v1/client-stats`` out of the served app: a server of an older release.

    The app's branch that holds the route (the misses router's) is replaced, in its place, by
    one of that router's other routes.
    """
    probe = {
        "type": "http",
        "method": "POST",
        "path": ROUTE,
        "root_path": "",
        "headers": [],
        "query_string": b"",
    }
    routes = app.router.routes
    index = next(i for i, route in enumerate(routes) if route.matches(probe)[0] == Match.FULL)
    older = APIRouter()
    older.routes.extend(route for route in api_misses.router.routes if getattr(route, "path", None) != ROUTE)
    assert len(older.routes) == len(api_misses.router.routes) - 1
    routes.pop(index)
    app.include_router(older)
    routes.insert(index, routes.pop())


# -- the sync client ---------------------------------------------------------------------------------


def test_answers_served_from_the_cache_are_counted_by_match_in_the_metrics(
    server: LiveServer, tmp_path: Path
) -> None:
    server.tune("add", TUNED, ADD_CONFIG)
    counting = CountingTransport()
    with ConfigClient(
        server.url, CHIP, token=ADMIN_TOKEN, settings=settings(tmp_path), transport=counting
    ) as client:
        assert client.prefetch() == 1  # every answer from now on comes from the client's memory
        assert client_answers(server.url) == served()  # every answer shows from the start, at 0
        assert {client.get("add", TUNED).match for _ in range(25)} == {"exact"}
        assert {client.get("add", NEAR).match for _ in range(7)} == {"nearest"}
        assert {client.get("add", NEAR, "float16").match for _ in range(3)} == {"default"}
        assert client.flush_stats()
        assert client_answers(server.url) == served(25, 7, 3)
        assert counting.paths.count(ROUTE) == 1
        assert client.flush_stats()  # nothing new: nothing sent
        assert counting.paths.count(ROUTE) == 1
        client.get("add", TUNED)
    assert counting.paths.count(ROUTE) == 2  # close() reports the last ones
    assert client_answers(server.url) == served(26, 7, 3)
    labels = " ".join(value for (_, pairs), _ in samples(server.url).items() for _, value in pairs)
    assert CHIP not in labels, "no chip (a name the caller chose) in any label"
    assert "n=" not in labels, "no shape in any label"


def test_an_answer_the_server_gave_is_its_lookup_not_a_client_answer(
    server: LiveServer, tmp_path: Path
) -> None:
    server.tune("add", TUNED, ADD_CONFIG)
    with ConfigClient(server.url, CHIP, token=ADMIN_TOKEN, settings=settings(tmp_path)) as client:
        first = client.get("add", TUNED)
        assert (first.match, first.source) == ("exact", "server")
        for _ in range(9):
            assert client.get("add", TUNED) is first
        assert client.flush_stats()
    metrics = samples(server.url)
    assert metrics[("tiletune_lookups_total", (("answer", "exact"),))] == 1
    assert client_answers(server.url) == served(exact=9)  # with the lookup: the 10 launches


def test_the_reporter_thread_sends_the_answers_with_the_misses(server: LiveServer, tmp_path: Path) -> None:
    with ConfigClient(
        server.url, CHIP, token=ADMIN_TOKEN, settings=settings(tmp_path, miss_flush_s=0.05)
    ) as client:
        for _ in range(4):
            assert client.get("add", {"n": 5000}).match == "default"  # nothing tuned: a miss
        assert wait_for(lambda: client_answers(server.url) == served(default=4))
        assert [m["shape_key"] for m in httpx.get(f"{server.url}/v1/misses").json()] == ["n=5000"]


def test_counts_of_a_report_that_failed_are_sent_with_the_next(server: LiveServer, tmp_path: Path) -> None:
    services = server.app.state.services
    with ConfigClient(server.url, CHIP, token=ADMIN_TOKEN, settings=settings(tmp_path)) as client:
        client.prefetch()
        for _ in range(3):
            client.get("add", {"n": 5000})
        services.miss_limit = RateLimiter(0.001, 1)  # one report now, then 429 for a long while
        assert client.flush_stats()
        for _ in range(5):
            client.get("add", {"n": 5000})
        assert not client.flush_stats()  # 429: the five are kept
        assert client_answers(server.url) == served(default=3)
        services.miss_limit = RateLimiter(1.0, 30)
        for _ in range(2):
            client.get("add", {"n": 5000})
        assert client.flush_stats()
    assert client_answers(server.url) == served(default=10)


def test_a_server_that_cannot_be_reached_keeps_the_counts(tmp_path: Path) -> None:
    down = f"http://127.0.0.1:{free_port()}"  # nobody listens
    with ConfigClient(down, CHIP, token=ADMIN_TOKEN, settings=settings(tmp_path, backoff_s=60.0)) as client:
        for _ in range(6):
            client.get("add", {"n": 5000})
        assert not client.flush_stats()
        assert not client.flush_stats()
        kept = client.core.answers.take()
        assert kept is not None
        assert kept.answers.model_dump() == served(default=6)


def test_an_older_server_without_the_route_is_told_no_stats_again_and_still_gets_the_misses(
    server: LiveServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server.tune("add", TUNED, ADD_CONFIG)
    without_the_route(server.app)
    assert httpx.post(f"{server.url}{ROUTE}", json={}, headers=ADMIN).status_code == 404
    counting = CountingTransport()
    with (
        caplog.at_level(logging.WARNING, logger="tiletune.client"),
        ConfigClient(
            server.url, CHIP, token=ADMIN_TOKEN, settings=settings(tmp_path), transport=counting
        ) as client,
    ):
        client.prefetch()
        client.get("add", TUNED)
        client.get("add", {"n": 5000}, "float16")
        assert client.flush_misses()
        assert not client.flush_stats()  # 404: reporting is off for good
        assert not client.core.answers.reporting
        for _ in range(10):
            client.get("add", TUNED)
        client.get("add", {"n": 6000}, "float16")
        assert client.flush_stats()  # nothing to send: nothing sent
        assert client.flush_misses()
    assert counting.paths.count(ROUTE) == 1
    assert caplog.text.count("takes no client stats") == 1
    misses = {m["shape_key"] for m in httpx.get(f"{server.url}/v1/misses").json()}
    assert misses == {"n=5000", "n=6000"}


def test_launches_from_many_threads_are_all_counted(tmp_path: Path) -> None:
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch as often as they can: a lost count would show
    try:
        with ConfigClient(None, CHIP, settings=settings(tmp_path)) as client:
            assert client.get("add", {"n": 5000}).match == "default"

            def launch() -> None:
                for _ in range(20_000):
                    client.get("add", {"n": 5000})

            threads = [threading.Thread(target=launch) for _ in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert client.core.answers.counted() == served(default=1 + 4 * 20_000)
    finally:
        sys.setswitchinterval(switch)


# -- the async client --------------------------------------------------------------------------------


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_the_async_client_reports_its_answers_too(server: LiveServer, tmp_path: Path) -> None:
    server.tune("add", TUNED, ADD_CONFIG)
    transport = httpx.ASGITransport(app=server.app)
    async with AsyncConfigClient(
        "http://tiletune", CHIP, token=ADMIN_TOKEN, settings=settings(tmp_path), transport=transport
    ) as client:
        assert await client.prefetch() == 1
        for _ in range(12):
            assert (await client.get("add", TUNED)).match == "exact"
        assert (await client.get("add", NEAR)).match == "nearest"
        assert await client.flush_stats()
        assert client_answers(server.url) == served(12, 1)
        assert await client.flush_stats()
        for _ in range(2):
            await client.get("softmax", {"rows": 8, "cols": 8})
    assert client_answers(server.url) == served(12, 1, 2)  # the close reported the last ones


@pytest.mark.anyio
async def test_the_async_client_stops_reporting_to_an_older_server(
    server: LiveServer, tmp_path: Path
) -> None:
    without_the_route(server.app)
    http = RecordingASGITransport(server.app)
    async with AsyncConfigClient(
        "http://tiletune", CHIP, token=ADMIN_TOKEN, settings=settings(tmp_path), transport=http
    ) as client:
        await client.get("add", {"n": 5000})
        assert await client.flush_misses()
        assert not await client.flush_stats()
        await client.get("add", {"n": 6000})
        assert await client.flush_stats()
    assert http.paths.count(ROUTE) == 1
    assert {m["shape_key"] for m in httpx.get(f"{server.url}/v1/misses").json()} == {"n=5000", "n=6000"}


# -- the route's contract, in process ----------------------------------------------------------------


@pytest.fixture
def closed(tmp_path: Path) -> Iterator[TestClient]:
    """The app with reads closed; one stats report (and one miss report) a token may send at once."""
    url = f"sqlite:///{tmp_path / 'closed.db'}"
    upgrade(url)
    app_settings = Settings(
        db_url=url, admin_token=ADMIN_SECRET, open_reads=False, miss_reports_per_s=0.001, miss_report_burst=2
    )
    with TestClient(create_app(app_settings, reaper=False)) as test_client:
        yield test_client


def report(answers: object, **fields: object) -> dict[str, object]:
    return {"chip": CHIP, "answers": answers, **fields}


def test_the_route_needs_a_token_when_reads_are_closed(closed: TestClient) -> None:
    refused = closed.post(ROUTE, json=report({"exact": 1}))
    assert refused.status_code == 401
    assert refused.json()["code"] == "unauthorized"
    accepted = closed.post(ROUTE, json=report({"exact": 4, "default": 1}), headers=ADMIN)
    assert (accepted.status_code, accepted.json()) == (200, {"accepted": 5, "keys": 0})


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (report({"exact": -1}), "answers.exact"),
        (report({"exact": MAX_REPORTED_ANSWERS + 1}), "answers.exact"),
        (report({"exact": True}), "answers.exact"),
        (report({"exact": "3"}), "answers.exact"),
        (report({"hit": 3}), "answers.hit"),
        (report({"exact": 1}, source="memory"), "source"),
        ({"answers": {"exact": 1}}, "chip"),
        (report({"exact": 1}) | {"chip": ""}, "chip"),
        (report([1, 2]), "answers"),
    ],
)
def test_a_bad_report_is_refused_naming_the_field(closed: TestClient, body: object, field: str) -> None:
    response = closed.post(ROUTE, json=body, headers=ADMIN)
    assert response.status_code == 422
    assert response.json()["field"] == field


def test_a_count_over_the_bound_of_a_report_is_refused_and_counts_nothing(closed: TestClient) -> None:
    assert MAX_REPORTED_ANSWERS == 100_000_000  # 20 million launches a second at the default 5 s
    over = closed.post(ROUTE, json=report({"exact": 1, "nearest": MAX_REPORTED_ANSWERS + 1}), headers=ADMIN)
    assert over.status_code == 422
    assert over.json()["field"] == "answers.nearest"
    metrics = closed.get("/metrics", headers=ADMIN).text
    assert 'tiletune_client_answers_total{answer="exact"} 0.0' in metrics
    assert 'tiletune_client_answers_total{answer="nearest"} 0.0' in metrics
    at_most = closed.post(ROUTE, json=report({"nearest": MAX_REPORTED_ANSWERS}), headers=ADMIN)
    assert (at_most.status_code, at_most.json()) == (200, {"accepted": MAX_REPORTED_ANSWERS, "keys": 0})


def test_a_client_sends_at_most_the_bound_and_the_rest_with_its_next_reports(tmp_path: Path) -> None:
    with ConfigClient(None, CHIP, settings=settings(tmp_path)) as client:
        tally = client.core.answers  # no server here: the reports are taken by hand
        launches = MAX_REPORTED_ANSWERS + 5
        next(itertools.islice(tally.counters["default"], launches, launches), None)  # counted as launches do
        first, second = tally.take(), tally.take()
        assert first is not None
        assert second is not None
        assert first.answers.default == MAX_REPORTED_ANSWERS
        assert second.answers.default == 5
        assert tally.take() is None


def test_stats_reports_are_limited_in_buckets_apart_from_the_miss_reports(closed: TestClient) -> None:
    for _ in range(2):
        assert closed.post(ROUTE, json=report({"exact": 1}), headers=ADMIN).status_code == 200
    limited = closed.post(ROUTE, json=report({"exact": 1}), headers=ADMIN)
    assert limited.status_code == 429
    assert int(limited.headers["Retry-After"]) >= 1
    miss = {"kernel": "add", "shape": {"n": 5000}, "dtype": "float32", "chip": CHIP, "match": "default"}
    assert closed.post("/v1/misses", json={"misses": [miss]}, headers=ADMIN).status_code == 200
    metrics = closed.get("/metrics", headers=ADMIN).text
    assert 'tiletune_client_answers_total{answer="exact"} 2.0' in metrics
