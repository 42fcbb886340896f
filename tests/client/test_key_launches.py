"""Launches per key in the clients' stats reports, stored by the real server (``key_usage``).

The clients (sync and async) run against the app of ``conftest.server`` (uvicorn on a thread,
SQLite; the async client through httpx's ASGI transport); the server's counts are flushed to its
store by hand (its reaper does it when it runs) and read back. A server of the release before
per-key counts is that app with ``POST /v1/client-stats`` served by that release's route (its
body refuses the unknown field ``keys``, as every request body does).
"""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest
from fastapi import APIRouter, FastAPI, Request
from pydantic import BaseModel, ConfigDict
from sqlalchemy import select

from tests.credentials import ADMIN_TOKEN
from tiletune.client import AsyncConfigClient, ConfigClient
from tiletune.client.answers import SPARE_COUNTERS
from tiletune.client.wire import MAX_REPORTED_KEYS, AnswerCounts, ClientStatsPublic
from tiletune.service.app import Services
from tiletune.service.models import KeyUsageRow

from .conftest import CHIP, LiveServer
from .test_client_stats import (
    ADD_CONFIG,
    NEAR,
    ROUTE,
    TUNED,
    CountingTransport,
    client_answers,
    served,
    settings,
    without_the_route,
)


def stored_launches(app: FastAPI) -> dict[tuple[str, str], int]:
    """The server's launches per key of ``add`` on CHIP, (shape key, dtype) -> launches, after
    flushing its counts to the store."""
    services: Services = app.state.services
    services.reads.usage.flush(services.db)
    with services.db.read() as session:
        rows = session.scalars(select(KeyUsageRow).where(KeyUsageRow.kernel == "add")).all()
        return {(row.shape_key, row.dtype): row.launches for row in rows}


def test_a_report_carries_each_keys_launches_and_the_server_stores_them(
    server: LiveServer, tmp_path: Path
) -> None:
    server.tune("add", TUNED, ADD_CONFIG)
    with ConfigClient(server.url, CHIP, token=ADMIN_TOKEN, settings=settings(tmp_path)) as client:
        assert client.prefetch() == 1  # every answer from now on comes from the client's memory
        for _ in range(25):
            client.get("add", TUNED)
        for _ in range(7):
            client.get("add", NEAR)
        for _ in range(3):
            client.get("add", NEAR, "float16")
        stats = client.core.answers.take()
        assert stats is not None
        launches = {(key.shape["n"], key.dtype): key.count for key in stats.keys}
        assert launches == {(65536, "float32"): 25, (131072, "float32"): 7, (131072, "float16"): 3}
        assert [key.count for key in stats.keys] == [25, 7, 3], "the most launched first"
        client.core.answers.failed(stats, httpx.ConnectError("taken by hand: sent with the next"))
        client.get("add", TUNED)
        assert client.flush_stats()
        assert stored_launches(server.app) == {
            ("n=65536", "float32"): 26,
            ("n=131072", "float32"): 7,
            ("n=131072", "float16"): 3,
        }
        client.pin()  # the remembered answers are dropped: their launches since are still sent
        for _ in range(4):
            client.get("add", TUNED)
    assert client_answers(server.url) == served(30, 7, 3)  # close() reported the last ones
    assert stored_launches(server.app)[("n=65536", "float32")] == 30


def test_the_servers_own_lookup_and_the_clients_launches_add_up(server: LiveServer, tmp_path: Path) -> None:
    server.tune("add", TUNED, ADD_CONFIG)
    with ConfigClient(server.url, CHIP, token=ADMIN_TOKEN, settings=settings(tmp_path)) as client:
        assert client.get("add", TUNED).source == "server"  # the server counts this one
        for _ in range(9):
            client.get("add", TUNED)
        stats = client.core.answers.take()
        assert stats is not None
        assert [(key.shape, key.count) for key in stats.keys] == [(TUNED, 9)]
        client.core.answers.failed(stats, httpx.ConnectError("taken by hand: sent with the next"))
    assert stored_launches(server.app) == {("n=65536", "float32"): 10}


def test_a_report_carries_the_most_launched_keys_and_the_others_with_the_next(
    server: LiveServer, tmp_path: Path
) -> None:
    extra = 30
    counting = CountingTransport()
    with ConfigClient(
        server.url, CHIP, token=ADMIN_TOKEN, settings=settings(tmp_path), transport=counting
    ) as client:
        client.pin()  # no lookups: every answer is the client's own
        sizes = [1000 + i for i in range(MAX_REPORTED_KEYS + extra)]
        for rank, n in enumerate(sizes):
            for _ in range(2 if rank < MAX_REPORTED_KEYS else 1):
                client.get("add", {"n": n})
        assert client.flush_stats()
        first = stored_launches(server.app)
        assert len(first) == MAX_REPORTED_KEYS
        assert set(first.values()) == {2}, "the most launched keys first"
        assert client.flush_stats()
        assert len(stored_launches(server.app)) == MAX_REPORTED_KEYS + extra
        assert client.flush_stats()  # nothing new: nothing sent
    assert counting.paths.count(ROUTE) == 2
    assert client_answers(server.url) == served(default=2 * MAX_REPORTED_KEYS + extra)


def test_counts_of_answers_dropped_and_decided_again_are_kept_and_bounded(tmp_path: Path) -> None:
    with ConfigClient(None, CHIP, settings=settings(tmp_path)) as client:
        tally = client.core.answers  # no server here: the reports are taken by hand
        for _ in range(3000):  # each round drops the answer: a new counter for the same key
            client.get("add", {"n": 5000})
            client.get("add", {"n": 5000})
            client.pin()
        assert len(tally._slots) <= 2 + SPARE_COUNTERS, "bounded without any report"
        assert tally.counted() == served(default=6000)
        stats = tally.take()
        assert stats is not None
        assert [(key.shape, key.count) for key in stats.keys] == [({"n": 5000}, 6000)]
        assert tally.take() is None
        assert tally._slots == [], "the counters of dropped answers are let go once idle"


class OlderClientStats(BaseModel):
    """``ClientStatsCreate`` of the release before per-key counts (unknown fields refused)."""

    model_config = ConfigDict(extra="forbid")

    chip: str
    answers: AnswerCounts


async def older_client_stats(stats: OlderClientStats, request: Request) -> ClientStatsPublic:
    """The route of the release before per-key counts: the answers into the metrics."""
    metrics = request.app.state.services.metrics
    return ClientStatsPublic(accepted=metrics.clients_answered(stats.answers.model_dump()))


def with_the_older_route(app: FastAPI) -> None:
    """Serve ``POST /v1/client-stats`` as the release before per-key counts did."""
    without_the_route(app)
    older = APIRouter()
    older.add_api_route(ROUTE, older_client_stats, methods=["POST"])
    app.include_router(older)
    app.router.routes.insert(0, app.router.routes.pop())


def test_a_server_that_refuses_keys_gets_the_answers_alone_from_then_on(
    server: LiveServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with_the_older_route(server.app)
    counting = CountingTransport()
    with (
        caplog.at_level(logging.WARNING, logger="tiletune.client"),
        ConfigClient(
            server.url, CHIP, token=ADMIN_TOKEN, settings=settings(tmp_path), transport=counting
        ) as client,
    ):
        client.pin()
        for _ in range(3):
            client.get("add", {"n": 5000})
        assert client.flush_stats()  # refused for its keys, then sent again at once without them
        assert counting.paths.count(ROUTE) == 2
        assert client_answers(server.url) == served(default=3)
        assert not client.core.answers.keyed
        client.get("add", {"n": 5000})
        assert client.flush_stats()
        assert counting.paths.count(ROUTE) == 3
    assert client_answers(server.url) == served(default=4)
    assert caplog.text.count("takes no launches per key") == 1
    assert stored_launches(server.app) == {}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_the_async_client_reports_its_keys_launches_too(server: LiveServer, tmp_path: Path) -> None:
    server.tune("add", TUNED, ADD_CONFIG)
    transport = httpx.ASGITransport(app=server.app)
    async with AsyncConfigClient(
        "http://tiletune", CHIP, token=ADMIN_TOKEN, settings=settings(tmp_path), transport=transport
    ) as client:
        assert await client.prefetch() == 1
        for _ in range(12):
            await client.get("add", TUNED)
        await client.get("add", NEAR)
        assert await client.flush_stats()
        assert stored_launches(server.app) == {("n=65536", "float32"): 12, ("n=131072", "float32"): 1}
        for _ in range(2):
            await client.get("add", TUNED)
    assert stored_launches(server.app)[("n=65536", "float32")] == 14  # the close reported the last ones
