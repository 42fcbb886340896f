"""Every request of both clients ends by its deadline and reads at most its cap, against servers that
trickle their headers or body, accept and never answer, or answer a gzip bomb (over 1 GiB inflated).

Lookup (``get`` answers the fallback), prefetch, refresh, miss and stats reports, sync and async: each
gives up within its documented bound and within 1 s, and the caller's memory (traced allocations)
grows by at most the cap of what it read plus a small margin. The servers are
:class:`~tests.client.hostile.RawServer` (real sockets on 127.0.0.1, a thread per connection);
the clients are the real ones.
"""

from __future__ import annotations

import asyncio
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tiletune.client import AsyncConfigClient, ClientSettings, ConfigClient
from tiletune.client.api import ServiceApi
from tiletune.client.calls import ServerUnreachableError, UnexpectedAnswerError

from .conftest import CHIP
from .hostile import (
    MISBEHAVE_FOR_S,
    Behaviour,
    RawServer,
    bomb,
    bundle_json,
    entry,
    gzip_bomb,
    gzipped,
    in_turn,
    json_reply,
    lookup_json,
    no_answer,
    replying,
    trickled_body,
    trickled_headers,
)

MISBEHAVIOURS: dict[str, Behaviour] = {
    "trickled headers": trickled_headers,
    "no answer": no_answer,
    "trickled body": trickled_body,
    "gzip bomb": bomb,
}
#: The documented bound of a lookup (the default ``timeout_s``).
LOOKUP_S = ClientSettings().timeout_s
#: The bounds these tests set for a bulk export and a report (the defaults are 30 s and 5 s).
BULK_S = 0.3
REPORT_S = 0.3
REFRESH_S = 0.05
#: The cap these tests set on a bulk export (the default is 256 MiB).
MAX_BUNDLE_BYTES = 8 << 20
#: The cap on a lookup's or a report's answer (the default ``max_answer_bytes``).
MAX_ANSWER_BYTES = ClientSettings().max_answer_bytes
#: What a machine shared with other work may add to a bound (the issue's ceiling is 1 s whatever).
SLACK_S = 0.5
#: Allocations beyond the cap: the request, its parts, logging.
MARGIN_BYTES = 2 << 20
SHAPE = {"n": 65536}
ADD_CONFIG = {"tile_size": 4096, "buffer_num": 2, "pipeline_depth": 2}
EMPTY_BUNDLE = json_reply(bundle_json([]))
FULL_BUNDLE = json_reply(bundle_json([entry("add", SHAPE, ADD_CONFIG)]))
NOT_FOUND = json_reply('{"code": "not_found", "message": "no"}', 404)


@pytest.fixture
def raw() -> Iterator[RawServer]:
    gzip_bomb()  # built once, before anything is measured
    with RawServer() as server:
        yield server


def bounded(tmp_path: Path, **overrides: Any) -> ClientSettings:
    """The test's settings: small bounds for the bulk export and the reports, no reporter running."""
    values: dict[str, Any] = {
        "cache_dir": tmp_path / "cache",
        "prefetch_timeout_s": BULK_S,
        "report_timeout_s": REPORT_S,
        "max_bundle_bytes": MAX_BUNDLE_BYTES,
        "miss_flush_s": 3600.0,
        **overrides,
    }
    return ClientSettings(**values)


@dataclass
class Spent:
    """What a block took: seconds, and the peak of the memory it allocated (bytes)."""

    seconds: float = 0.0
    peak_bytes: int = 0

    def within(self, bound_s: float, cap_bytes: int) -> None:
        assert self.seconds <= min(1.0, bound_s + SLACK_S), f"{self.seconds:.2f} s (bound {bound_s} s)"
        assert self.peak_bytes <= cap_bytes + MARGIN_BYTES, f"{self.peak_bytes / 2**20:.1f} MiB allocated"


@contextmanager
def spending() -> Iterator[Spent]:
    """Measure the block: seconds, and the peak of what it allocated beyond what was allocated before
    (all threads, this process's stand-in server's too)."""
    spent = Spent()
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    before_bytes = tracemalloc.get_traced_memory()[0]
    start = time.monotonic()
    try:
        yield spent
    finally:
        spent.seconds = time.monotonic() - start
        spent.peak_bytes = tracemalloc.get_traced_memory()[1] - before_bytes
        if not tracing:
            tracemalloc.stop()


def wait_for(condition: Callable[[], bool], timeout_s: float = MISBEHAVE_FOR_S + 2) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


parametrized = pytest.mark.parametrize("misbehaviour", list(MISBEHAVIOURS), ids=list(MISBEHAVIOURS))


# -- the sync client ----------------------------------------------------------------------------------


@parametrized
def test_a_lookup_answers_the_fallback_within_its_bound(
    raw: RawServer, tmp_path: Path, misbehaviour: str
) -> None:
    raw.answer("/v1/configs/add", MISBEHAVIOURS[misbehaviour])
    with ConfigClient(raw.url, CHIP, settings=bounded(tmp_path)) as client:
        with spending() as spent:
            tiling = client.get("add", SHAPE)
        assert (tiling.match, tiling.source) == ("default", "default")
        assert not client.core.server_usable()  # backed off: the next launches do not wait
    spent.within(LOOKUP_S, MAX_ANSWER_BYTES)


@parametrized
def test_a_prefetch_gives_up_within_its_bound(raw: RawServer, tmp_path: Path, misbehaviour: str) -> None:
    raw.answer("/v1/configs", MISBEHAVIOURS[misbehaviour])
    with ConfigClient(raw.url, CHIP, settings=bounded(tmp_path)) as client:
        with spending() as spent:
            assert client.prefetch() == 0
        assert client.get("add", SHAPE).match == "default"
    spent.within(BULK_S, MAX_BUNDLE_BYTES)
    assert raw.requests("/v1/configs/add") == []  # backed off


@parametrized
def test_a_refresh_gives_up_within_its_bound_and_the_next_one_is_taken(
    raw: RawServer, tmp_path: Path, misbehaviour: str
) -> None:
    raw.answer(
        "/v1/configs", in_turn(replying(EMPTY_BUNDLE), MISBEHAVIOURS[misbehaviour], replying(FULL_BUNDLE))
    )
    with ConfigClient(raw.url, CHIP, settings=bounded(tmp_path, refresh_s=REFRESH_S)) as client:
        assert client.prefetch() == 0
        assert client.get("add", SHAPE).match == "default"
        with spending() as spent:
            assert wait_for(lambda: client.get("add", SHAPE).match == "exact")
    spent.within(BULK_S + 2 * REFRESH_S, MAX_BUNDLE_BYTES)
    assert len(raw.requests("/v1/configs")) == 3


@parametrized
def test_a_miss_report_gives_up_within_its_bound(raw: RawServer, tmp_path: Path, misbehaviour: str) -> None:
    raw.answer("/v1/misses", MISBEHAVIOURS[misbehaviour])
    with ConfigClient(raw.url, CHIP, settings=bounded(tmp_path)) as client:
        assert client.get("add", SHAPE).match == "default"  # the lookup's 404: a miss
        with spending() as spent:
            assert not client.flush_misses()
        assert client.core.misses.take() is not None  # kept for the next report
        raw.answer("/v1/misses", NOT_FOUND)
    spent.within(REPORT_S, MAX_ANSWER_BYTES)


@parametrized
def test_a_stats_report_gives_up_within_its_bound(raw: RawServer, tmp_path: Path, misbehaviour: str) -> None:
    raw.answer("/v1/client-stats", MISBEHAVIOURS[misbehaviour])
    with ConfigClient(raw.url, CHIP, settings=bounded(tmp_path)) as client:
        assert client.prefetch() == 0  # the 404 of the bulk export: answers from the default
        client.get("add", SHAPE)
        with spending() as spent:
            assert not client.flush_stats()
        raw.answer("/v1/client-stats", NOT_FOUND)
    spent.within(REPORT_S, MAX_ANSWER_BYTES)


# -- the async client ---------------------------------------------------------------------------------


@parametrized
def test_an_async_lookup_answers_the_fallback_within_its_bound(
    raw: RawServer, tmp_path: Path, misbehaviour: str
) -> None:
    raw.answer("/v1/configs/add", MISBEHAVIOURS[misbehaviour])

    async def scenario() -> Spent:
        async with AsyncConfigClient(raw.url, CHIP, settings=bounded(tmp_path)) as client:
            with spending() as spent:
                tiling = await client.get("add", SHAPE)
            assert (tiling.match, tiling.source) == ("default", "default")
            assert not client.core.server_usable()
        return spent

    asyncio.run(scenario()).within(LOOKUP_S, MAX_ANSWER_BYTES)


@parametrized
def test_an_async_prefetch_gives_up_within_its_bound(
    raw: RawServer, tmp_path: Path, misbehaviour: str
) -> None:
    raw.answer("/v1/configs", MISBEHAVIOURS[misbehaviour])

    async def scenario() -> Spent:
        async with AsyncConfigClient(raw.url, CHIP, settings=bounded(tmp_path)) as client:
            with spending() as spent:
                assert await client.prefetch() == 0
            assert (await client.get("add", SHAPE)).match == "default"
        return spent

    asyncio.run(scenario()).within(BULK_S, MAX_BUNDLE_BYTES)


@parametrized
def test_an_async_refresh_gives_up_within_its_bound_and_the_next_one_is_taken(
    raw: RawServer, tmp_path: Path, misbehaviour: str
) -> None:
    raw.answer(
        "/v1/configs", in_turn(replying(EMPTY_BUNDLE), MISBEHAVIOURS[misbehaviour], replying(FULL_BUNDLE))
    )

    async def scenario() -> Spent:
        async with AsyncConfigClient(
            raw.url, CHIP, settings=bounded(tmp_path, refresh_s=REFRESH_S)
        ) as client:
            assert await client.prefetch() == 0
            assert (await client.get("add", SHAPE)).match == "default"
            with spending() as spent:
                until = time.monotonic() + MISBEHAVE_FOR_S + 2
                while (await client.get("add", SHAPE)).match != "exact" and time.monotonic() < until:
                    await asyncio.sleep(0.01)
            assert (await client.get("add", SHAPE)).match == "exact"
        return spent

    asyncio.run(scenario()).within(BULK_S + 2 * REFRESH_S, MAX_BUNDLE_BYTES)
    assert len(raw.requests("/v1/configs")) == 3


@parametrized
def test_an_async_miss_report_gives_up_within_its_bound(
    raw: RawServer, tmp_path: Path, misbehaviour: str
) -> None:
    raw.answer("/v1/misses", MISBEHAVIOURS[misbehaviour])

    async def scenario() -> Spent:
        async with AsyncConfigClient(raw.url, CHIP, settings=bounded(tmp_path)) as client:
            assert (await client.get("add", SHAPE)).match == "default"
            with spending() as spent:
                assert not await client.flush_misses()
            assert client.core.misses.take() is not None
            raw.answer("/v1/misses", NOT_FOUND)
        return spent

    asyncio.run(scenario()).within(REPORT_S, MAX_ANSWER_BYTES)


@parametrized
def test_an_async_stats_report_gives_up_within_its_bound(
    raw: RawServer, tmp_path: Path, misbehaviour: str
) -> None:
    raw.answer("/v1/client-stats", MISBEHAVIOURS[misbehaviour])

    async def scenario() -> Spent:
        async with AsyncConfigClient(raw.url, CHIP, settings=bounded(tmp_path)) as client:
            assert await client.prefetch() == 0
            await client.get("add", SHAPE)
            with spending() as spent:
                assert not await client.flush_stats()
            raw.answer("/v1/client-stats", NOT_FOUND)
        return spent

    asyncio.run(scenario()).within(REPORT_S, MAX_ANSWER_BYTES)


# -- the REST client of the worker and the command line -------------------------------------------


@parametrized
def test_a_call_of_the_rest_client_ends_by_its_deadline(raw: RawServer, misbehaviour: str) -> None:
    raw.answer("/v1/sweeps/7", MISBEHAVIOURS[misbehaviour])
    expected = UnexpectedAnswerError if misbehaviour == "gzip bomb" else ServerUnreachableError
    api = ServiceApi(raw.url, deadline_s=0.3, max_bytes=MAX_ANSWER_BYTES)
    with api, spending() as spent, pytest.raises(expected, match=r"within 0\.3 s|more than"):
        api.sweep(7)
    spent.within(0.3, MAX_ANSWER_BYTES)


def test_answers_within_the_bounds_are_read_gzip_or_not(raw: RawServer, tmp_path: Path) -> None:
    raw.answer("/v1/configs/add", json_reply(lookup_json("add", SHAPE, ADD_CONFIG)))
    raw.answer("/v1/configs", gzipped(FULL_BUNDLE))
    with ConfigClient(raw.url, CHIP, settings=bounded(tmp_path)) as client:
        assert client.get("add", SHAPE).match == "exact"
        assert client.prefetch() == 1
    assert raw.requests("/v1/configs")[0].headers["accept-encoding"] == "gzip"


def test_a_bundle_over_the_cap_is_refused_and_one_at_the_cap_read(raw: RawServer, tmp_path: Path) -> None:
    body = FULL_BUNDLE.body
    raw.answer("/v1/configs", gzipped(FULL_BUNDLE))
    with ConfigClient(raw.url, CHIP, settings=bounded(tmp_path, max_bundle_bytes=len(body) - 1)) as client:
        assert client.prefetch() == 0
        assert not client.core.server_usable()
    with ConfigClient(raw.url, CHIP, settings=bounded(tmp_path, max_bundle_bytes=len(body))) as client:
        assert client.prefetch() == 1


def test_the_environments_proxy_is_used(
    raw: RawServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("no_proxy", "NO_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("http_proxy", raw.url)
    raw.answer("/v1/configs/add", json_reply(lookup_json("add", SHAPE, ADD_CONFIG)))
    with ConfigClient("http://tuner.invalid:8642", CHIP, settings=bounded(tmp_path)) as client:
        assert client.get("add", SHAPE).match == "exact"
    assert raw.requests("/v1/configs/add")[0].target.startswith("http://tuner.invalid:8642/v1/configs/add?")
