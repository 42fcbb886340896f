"""The client against answers it cannot use: prefetch and refresh never raise, threads survive,
bad configs are refused (logged once) and replaced by the default, a bundle is refreshed
conditionally (ETag, ``304``), gzip bodies are read.

The server here is :class:`~tests.client.hostile.HostileServer` (a stand-in server over real
HTTP); the client is the real one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tiletune.client import ClientSettings, ConfigClient
from tiletune.kernels import client_settings, get_kernel, select_config
from tiletune.kernels.device import get_device

from .conftest import CHIP
from .hostile import (
    BAD_GZIP,
    GARBAGE,
    HTML,
    OTHER_SCHEMA,
    SERVER_ERROR,
    HostileServer,
    Reply,
    Seen,
    bundle_json,
    entry,
    gzipped,
    json_reply,
    lookup_json,
    serve,
)

ADD_CONFIG = {"tile_size": 4096, "buffer_num": 2, "pipeline_depth": 2}
HOSTILE = {
    "html": HTML,
    "other schema": OTHER_SCHEMA,
    "garbage": GARBAGE,
    "500": SERVER_ERROR,
    "bad gzip": BAD_GZIP,
}


@pytest.fixture
def hostile() -> Iterator[HostileServer]:
    yield from serve(HostileServer())


def settings(tmp_path: Path, **overrides: object) -> ClientSettings:
    values: dict[str, object] = {"cache_dir": tmp_path / "cache", "timeout_s": 2.0, "miss_flush_s": 3600.0}
    values.update(overrides)
    return client_settings(**values)


def default_of(kernel: str, shape: dict[str, int]) -> dict[str, int]:
    spec = get_kernel(kernel)
    return dict(spec.default_config(spec.parse_shape(shape), "float32", get_device("cpu").chip.limits))


def warnings_with(caplog: pytest.LogCaptureFixture, text: str) -> int:
    return sum(text in record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING)


def wait_for(condition: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


# -- prefetch and refresh -------------------------------------------------------------------------


@pytest.mark.parametrize("answer", list(HOSTILE), ids=list(HOSTILE))
def test_a_prefetch_of_an_answer_that_is_no_bundle_returns_0_and_backs_off(
    hostile: HostileServer, tmp_path: Path, answer: str
) -> None:
    hostile.answer("/v1/configs", HOSTILE[answer])
    hostile.answer("/v1/configs/add", HOSTILE[answer])
    with ConfigClient(hostile.url, CHIP, settings=settings(tmp_path, backoff_s=60.0)) as client:
        assert client.prefetch() == 0
        assert not client.core.prefetched
        assert not client.core.server_usable()  # backed off, as for a 5xx
        tiling = client.get("add", {"n": 65536})
    assert (tiling.match, dict(tiling.config)) == ("default", default_of("add", {"n": 65536}))
    assert hostile.requests("/v1/configs/add") == []  # the back-off spared the launch a request


def test_the_refresh_thread_survives_hostile_answers_and_takes_the_next_good_bundle(
    hostile: HostileServer, tmp_path: Path
) -> None:
    good = json_reply(bundle_json([entry("add", {"n": 65536}, ADD_CONFIG)]))
    answers = iter([json_reply(bundle_json([])), HTML, OTHER_SCHEMA, GARBAGE, SERVER_ERROR, BAD_GZIP])
    hostile.answer("/v1/configs", lambda _seen: next(answers, good))
    with ConfigClient(hostile.url, CHIP, settings=settings(tmp_path, refresh_s=0.05)) as client:
        assert client.prefetch() == 0  # an empty bundle
        assert client.get("add", {"n": 65536}).match == "default"
        assert wait_for(lambda: client.get("add", {"n": 65536}).match == "exact")
        assert client._refresher is not None
        assert client._refresher.is_alive()
    assert len(hostile.requests("/v1/configs")) >= 7


def test_the_miss_reporter_survives_hostile_answers(hostile: HostileServer, tmp_path: Path) -> None:
    answers = iter([HTML, GARBAGE, SERVER_ERROR, BAD_GZIP, OTHER_SCHEMA])
    accepted = json_reply('{"accepted": 1, "queued_jobs": []}')
    hostile.answer("/v1/misses", lambda _seen: next(answers, accepted))
    hostile.answer("/v1/configs", json_reply(bundle_json([])))
    with ConfigClient(hostile.url, CHIP, settings=settings(tmp_path, miss_flush_s=0.02)) as client:
        client.prefetch()
        client.get("add", {"n": 5000})
        assert wait_for(lambda: len(hostile.requests("/v1/misses")) >= 6)
        assert client._reporter is not None
        assert client._reporter.is_alive()
        client.get("add", {"n": 6000})
        assert wait_for(lambda: len(hostile.requests("/v1/misses")) >= 7)
        assert client._reporter.is_alive()


def test_a_miss_the_server_refuses_is_dropped_alone_and_never_counted_again(
    hostile: HostileServer, tmp_path: Path
) -> None:
    sent: list[Seen] = []

    def misses(seen: Seen) -> Reply:
        sent.append(seen)
        if len(sent) == 1:
            error = '{"code": "invalid_input", "message": "no such kernel", "field": "misses[0].kernel"}'
            return json_reply(error, status=422)
        return json_reply('{"accepted": 1, "queued_jobs": []}')

    hostile.answer("/v1/misses", misses)
    hostile.answer("/v1/configs", json_reply(bundle_json([])))
    with ConfigClient(hostile.url, CHIP, settings=settings(tmp_path)) as client:
        client.prefetch()  # no lookups: the server never saw the key before the report
        client.get("not_registered", {"n": 1})  # first: misses[0]
        client.get("add", {"n": 5000})
        assert client.flush_misses()  # the refused key dropped, the other sent at once
        assert len(sent) == 2
        client.core.forget_answers()
        client.get("not_registered", {"n": 1})
        assert client.core.misses.take() is None  # refused once: never counted again


def test_a_key_the_lookup_refuses_is_never_counted(hostile: HostileServer, tmp_path: Path) -> None:
    error = '{"code": "invalid_input", "message": "no such kernel", "field": "kernel"}'
    hostile.answer("/v1/configs/not_registered", json_reply(error, status=422))
    with ConfigClient(hostile.url, CHIP, settings=settings(tmp_path)) as client:
        assert client.get("not_registered", {"n": 1}).match == "default"
        assert client.core.misses.take() is None
        assert client.core.server_usable()  # a refusal is an answer: no back-off


# -- conditional refresh and gzip -----------------------------------------------------------------


def test_a_prefetch_sends_the_etag_it_holds_and_keeps_its_bundle_on_a_304(
    hostile: HostileServer, tmp_path: Path
) -> None:
    versions = {"etag": '"v1"', "body": bundle_json([entry("add", {"n": 65536}, ADD_CONFIG)])}

    def configs(seen: Seen) -> Reply:
        if seen.headers.get("if-none-match") == versions["etag"]:
            return Reply(304, b"", {"etag": versions["etag"]})
        return json_reply(versions["body"], etag=versions["etag"])

    hostile.answer("/v1/configs", configs)
    with ConfigClient(hostile.url, CHIP, settings=settings(tmp_path)) as client:
        assert client.prefetch() == 1
        assert client.core.disk is not None
        written = client.core.disk.path.stat().st_mtime_ns
        exact = client.get("add", {"n": 65536})
        assert exact.match == "exact"
        assert client.prefetch() == 0  # not modified: nothing new
        assert client.get("add", {"n": 65536}) is exact  # the bundle and the answers are kept
        assert client.core.disk.path.stat().st_mtime_ns == written
        versions.update(etag='"v2"', body=bundle_json([entry("add", {"n": 4096}, ADD_CONFIG)]))
        assert client.prefetch() == 1
        assert client.get("add", {"n": 4096}).match == "exact"
    sent = [seen.headers.get("if-none-match") for seen in hostile.requests("/v1/configs")]
    assert sent == [None, '"v1"', '"v1"']


def test_without_an_etag_a_prefetch_is_unconditional(hostile: HostileServer, tmp_path: Path) -> None:
    hostile.answer("/v1/configs", json_reply(bundle_json([entry("add", {"n": 65536}, ADD_CONFIG)])))
    with ConfigClient(hostile.url, CHIP, settings=settings(tmp_path)) as client:
        assert client.prefetch() == 1
        assert client.prefetch() == 1
    assert [seen.headers.get("if-none-match") for seen in hostile.requests("/v1/configs")] == [None, None]


def test_a_gzip_bundle_is_read(hostile: HostileServer, tmp_path: Path) -> None:
    plain = json_reply(bundle_json([entry("add", {"n": 65536}, ADD_CONFIG)]))
    hostile.answer(
        "/v1/configs", lambda seen: gzipped(plain) if "gzip" in seen.headers["accept-encoding"] else plain
    )
    with ConfigClient(hostile.url, CHIP, settings=settings(tmp_path)) as client:
        assert client.prefetch() == 1
        assert client.get("add", {"n": 65536}).match == "exact"


# -- bad configs are refused, logged once, and the default serves ----------------------------------

BAD_CONFIGS = {
    "negative": {**ADD_CONFIG, "tile_size": -1},
    "zero": {**ADD_CONFIG, "tile_size": 0},
    "unknown knob": {"tile_sise": 4096, "buffer_num": 2, "pipeline_depth": 2},
    "missing knob": {"tile_size": 4096, "buffer_num": 2},
    "outside the values": {**ADD_CONFIG, "tile_size": 3000},
    "above the dim": {**ADD_CONFIG, "tile_size": 131072},
}


def with_kernels_info_on_disk(url: str, tmp_path: Path) -> None:
    """A first client of the node prefetched the kernels' info (no configs) into the disk cache."""
    with ConfigClient(url, CHIP, settings=settings(tmp_path)) as first:
        assert first.prefetch() == 0


@pytest.mark.parametrize("bad", [b for b in BAD_CONFIGS if b != "negative"])
def test_a_bad_config_in_a_lookup_answer_is_replaced_by_the_default_and_logged_once(
    hostile: HostileServer, tmp_path: Path, caplog: pytest.LogCaptureFixture, bad: str
) -> None:
    shape = {"n": 65536}
    hostile.answer("/v1/configs", json_reply(bundle_json([])))
    with_kernels_info_on_disk(hostile.url, tmp_path)
    hostile.answer("/v1/configs/add", json_reply(lookup_json("add", shape, BAD_CONFIGS[bad])))
    client = ConfigClient(hostile.url, CHIP, settings=settings(tmp_path, recheck_s=0.0))
    with caplog.at_level(logging.WARNING, logger="tiletune.client"), client:
        answers = []
        for _ in range(3):  # decided again each time (recheck 0): asked, refused, default
            client.core.expire()
            answers.append(client.get("add", shape))
        assert client.core.known.exact("add", 1, shape, "float32") is None  # nothing of it kept
    assert {(a.match, a.source) for a in answers} == {("default", "default")}
    assert all(dict(a.config) == default_of("add", shape) for a in answers)
    assert len(hostile.requests("/v1/configs/add")) == 3
    assert warnings_with(caplog, "refusing the server's config") == 1


def test_a_negative_config_in_a_lookup_answer_is_no_answer_of_the_api(
    hostile: HostileServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shape = {"n": 65536}
    hostile.answer("/v1/configs/add", json_reply(lookup_json("add", shape, BAD_CONFIGS["negative"])))
    client = ConfigClient(hostile.url, CHIP, settings=settings(tmp_path, recheck_s=0.0))
    with caplog.at_level(logging.WARNING, logger="tiletune.client"), client:
        answers = []
        for _ in range(20):
            client.core.expire()
            answers.append(client.get("add", shape))
    assert all(a.match == "default" and dict(a.config) == default_of("add", shape) for a in answers)
    assert len(hostile.requests("/v1/configs/add")) == 1  # backed off, as for any answer not the API's
    assert warnings_with(caplog, "not a tiletune LookupPublic") == 1


def test_an_answer_carrying_the_shapes_knob_values_is_checked_against_them(
    hostile: HostileServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shape = {"n": 65536}
    values = {"tile_size": [256, 4096], "buffer_num": [1, 2], "pipeline_depth": [2]}
    good = lookup_json("add", shape, ADD_CONFIG, knob_values=values)
    hostile.answer("/v1/configs/add", json_reply(good))
    with ConfigClient(hostile.url, CHIP, settings=settings(tmp_path)) as client:
        assert client.get("add", shape).match == "exact"
        hostile.answer(
            "/v1/configs/add",
            json_reply(lookup_json("add", {"n": 4096}, {**ADD_CONFIG, "buffer_num": 3}, knob_values=values)),
        )
        with caplog.at_level(logging.WARNING, logger="tiletune.client"):
            assert client.get("add", {"n": 4096}).match == "default"
    assert warnings_with(caplog, "refusing the server's config") == 1


def test_without_kernel_info_the_structure_is_checked(hostile: HostileServer, tmp_path: Path) -> None:
    shape = {"n": 65536}
    hostile.answer("/v1/configs/add", json_reply(lookup_json("add", shape, {**ADD_CONFIG, "tile_size": 0})))
    with ConfigClient(hostile.url, CHIP, settings=settings(tmp_path)) as client:
        assert client.get("add", shape).match == "default"
        hostile.answer("/v1/configs/add", json_reply(lookup_json("add", {"n": 4096}, {"some_knob": 7})))
        assert client.get("add", {"n": 4096}).match == "exact"  # an old server: names unknown, structure fine


@pytest.mark.parametrize("bad", [b for b in BAD_CONFIGS if b != "negative"])
def test_a_bad_config_in_a_bundle_is_refused_and_logged_once(
    hostile: HostileServer, tmp_path: Path, caplog: pytest.LogCaptureFixture, bad: str
) -> None:
    good_shape, bad_shape = {"n": 4096}, {"n": 65536}
    entries = [
        entry("add", good_shape, {**ADD_CONFIG, "tile_size": 1024}),
        entry("add", bad_shape, BAD_CONFIGS[bad]),
    ]
    hostile.answer("/v1/configs", json_reply(bundle_json(entries)))
    with caplog.at_level(logging.WARNING, logger="tiletune.client"):
        with ConfigClient(hostile.url, CHIP, settings=settings(tmp_path)) as client:
            assert client.prefetch() == 2
            assert client.get("add", good_shape).match == "exact"
            assert client.get("add", bad_shape).match == "nearest"  # the bad entry is not there
            assert client.prefetch() == 2  # again: refused again, not logged again
        with ConfigClient(None, CHIP, settings=settings(tmp_path)) as offline:  # the disk cache
            assert offline.get("add", good_shape).match == "exact"
            assert offline.get("add", bad_shape).match == "nearest"
    assert warnings_with(caplog, "refusing the config") == 1  # the disk cache never held it
    assert client.core.disk is not None
    assert '"n=65536"' not in client.core.disk.path.read_text()


def test_a_nearest_config_is_adapted_to_the_asked_shape(hostile: HostileServer, tmp_path: Path) -> None:
    hostile.answer("/v1/configs", json_reply(bundle_json([entry("add", {"n": 65536}, ADD_CONFIG)])))
    with ConfigClient(hostile.url, CHIP, settings=settings(tmp_path)) as client:
        client.prefetch()
        near = client.get("add", {"n": 1000})
        assert (near.match, dict(near.config)) == ("nearest", {**ADD_CONFIG, "tile_size": 1000})
        spec = get_kernel("add")
        a, b = spec.make_inputs({"n": 1000}, "float32", get_device("cpu").torch_device)
        assert select_config("add", a, b, client=client).source == "client"  # the launcher takes it


def test_an_etag_that_may_not_be_sent_back_is_not_kept(hostile: HostileServer, tmp_path: Path) -> None:
    body = bundle_json([entry("add", {"n": 65536}, ADD_CONFIG)])
    hostile.answer("/v1/configs", json_reply(body, etag='"with a space" and more, ' + "x" * 300))
    with ConfigClient(hostile.url, CHIP, settings=settings(tmp_path)) as client:
        assert client.prefetch() == 1
        assert client.prefetch() == 1
    assert [seen.headers.get("if-none-match") for seen in hostile.requests("/v1/configs")] == [None, None]
