"""The launch path never raises, whatever it is given, and the background threads outlive it.

Property tests (hypothesis) drive ``get`` of the sync and async clients against the real
server with arbitrary kernels, shapes and dtypes: ``None``, text, lists, unhashable values,
bools, floats, huge ints, unknown kernels. Every answer is a :class:`Tiling`; a bad key is
the default, logged once per kind of problem; the miss reporter and the refresher still run.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from types import MappingProxyType
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.credentials import ADMIN_TOKEN
from tiletune.client import AsyncConfigClient, ClientSettings, ConfigClient, Tiling
from tiletune.client.wire import MATCH_KINDS, MAX_DIM
from tiletune.kernels import client_settings, get_kernel
from tiletune.kernels.device import get_device

from .conftest import CHIP, LiveServer

ADD_CONFIG = {"tile_size": 4096, "buffer_num": 2, "pipeline_depth": 2}

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=MAX_DIM - 2, max_value=MAX_DIM + 2)
    | st.floats(allow_nan=True)
    | st.text(max_size=80)
    | st.binary(max_size=8)
)
anything = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=8) | st.integers(), inner, max_size=3)
        | st.sets(st.integers(), max_size=3)
    ),
    max_leaves=8,
)
dim_names = st.sampled_from(["n", "rows", "cols", "m", "k", "causal"]) | st.text(max_size=70)
shapes = (
    anything
    | st.dictionaries(dim_names, anything, max_size=20)
    | st.dictionaries(st.sampled_from(["n"]), st.integers(min_value=-5, max_value=2**70))
    | st.dictionaries(dim_names, st.integers(min_value=0, max_value=4096), max_size=4).map(MappingProxyType)
)
kernels = st.sampled_from(["add", "softmax", "not_registered"]) | anything
dtypes = st.sampled_from(["float32", "float16", "float64"]) | anything


def client_settings_for(tmp_path: Path, **overrides: object) -> ClientSettings:
    values: dict[str, object] = {
        "cache_dir": tmp_path / "cache",
        "timeout_s": 2.0,
        "miss_flush_s": 0.01,
        "refresh_s": 0.05,
        "recheck_s": 0.0,
    }
    values.update(overrides)
    return client_settings(**values)


def default_of(kernel: str, shape: dict[str, int]) -> dict[str, int]:
    spec = get_kernel(kernel)
    return dict(spec.default_config(spec.parse_shape(shape), "float32", get_device("cpu").chip.limits))


@pytest.fixture
def tuned(server: LiveServer, tmp_path: Path) -> Iterator[ConfigClient]:
    server.tune("add", {"n": 65536}, ADD_CONFIG)
    with ConfigClient(server.url, CHIP, token=ADMIN_TOKEN, settings=client_settings_for(tmp_path)) as client:
        assert client.get("add", {"n": 65536}).match == "exact"
        yield client


def check(answer: object) -> None:
    assert isinstance(answer, Tiling)
    assert answer.match in MATCH_KINDS
    assert all(isinstance(k, str) and isinstance(v, int) for k, v in answer.config.items())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kernel=kernels, shape=shapes, dtype=dtypes)
def test_get_never_raises_whatever_it_is_given(
    tuned: ConfigClient, kernel: Any, shape: Any, dtype: Any
) -> None:
    check(tuned.get(kernel, shape, dtype))
    check(tuned.get(kernel, shape))


def test_the_background_threads_outlive_bad_keys(tuned: ConfigClient, server: LiveServer) -> None:
    bad: list[Any] = [None, "n=64", [("n", 64)], {"n": [64]}, {"n": "64"}, {"n": True}, {"n": 2**80}, {1: 2}]
    for shape in bad:
        for kernel in ("add", None, ["add"]):
            check(tuned.get(kernel, shape))  # type: ignore[arg-type]
    check(tuned.get("add", {"n": 5000}))  # a good miss among the bad keys
    tuned.prefetch()  # starts the refresher
    for _ in range(3):
        tuned.core.expire()
        for shape in bad:
            check(tuned.get("add", shape))
    assert tuned._reporter is not None
    assert tuned._refresher is not None
    deadline = time.monotonic() + 10
    while httpx.get(f"{server.url}/v1/misses").json() == [] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [m["shape_key"] for m in httpx.get(f"{server.url}/v1/misses").json()] == ["n=5000"]
    assert tuned._reporter.is_alive()
    assert tuned._refresher.is_alive()
    assert tuned.get("add", {"n": 65536}).match == "exact"


@pytest.mark.parametrize(
    "shape",
    [None, "n=64", [("n", 64)], {"n": [64]}, {"n": "64"}, {"n": True}, {"n": 64.0}, {"n": 2**80}, {"n": -1}],
    ids=["None", "str", "list", "unhashable", "str dim", "bool dim", "float dim", "huge", "negative"],
)
def test_a_bad_key_is_the_default_logged_once_never_asked_never_counted(
    tuned: ConfigClient, caplog: pytest.LogCaptureFixture, shape: Any
) -> None:
    tuned.core.misses.take()
    with caplog.at_level(logging.WARNING, logger="tiletune.client"):
        answers = [tuned.get("add", shape) for _ in range(1000)]
    assert {(a.match, a.source) for a in answers} == {("default", "default")}
    # The settings' default rule where it makes something of the key (a list of pairs), else {}.
    assert all(dict(a.config) in ({}, default_of("add", {"n": 64})) for a in answers)
    assert sum("bad launch key" in r.getMessage() for r in caplog.records) == 1
    assert len(caplog.records) <= 2  # and, at most, once that the default rule has no config for it
    assert tuned.core.misses.take() is None


def test_a_bad_key_never_takes_the_place_of_a_good_one(tuned: ConfigClient) -> None:
    assert tuned.get("add", {"n": 4096.0}).match == "default"  # type: ignore[dict-item]
    assert tuned.get("add", {"n": 4096}).match == "nearest"  # 4096.0 == 4096: not remembered for it
    assert tuned.get("add", {"n": True}).match == "default"
    assert tuned.get("add", {"n": 1}).match == "nearest"


def test_an_unknown_kernel_is_the_default_without_a_log_flood(
    tuned: ConfigClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="tiletune.client"):
        answers = [tuned.get("not_registered", {"n": n}) for n in range(1, 200)]
    assert {(a.match, len(a.config)) for a in answers} == {("default", 0)}
    assert len(caplog.records) == 1


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_the_async_client_never_raises_and_its_tasks_outlive_bad_keys(
    server: LiveServer, tmp_path: Path
) -> None:
    server.tune("add", {"n": 65536}, ADD_CONFIG)
    transport = httpx.ASGITransport(app=server.app)
    examples = [
        (kernel, shape, dtype)
        for kernel in ("add", None, ["x"], "not_registered")
        for shape in (
            None,
            "n=1",
            {"n": [1]},
            {"n": "1"},
            {"n": False},
            {"n": 2**80},
            {"n": 65536},
            {"n": 5000},
        )
        for dtype in ("float32", None, ["float32"])
    ]
    async with AsyncConfigClient(
        "http://tiletune",
        CHIP,
        token=ADMIN_TOKEN,
        settings=client_settings_for(tmp_path),
        transport=transport,
    ) as client:
        for kernel, shape, dtype in examples:
            check(await client.get(kernel, shape, dtype))  # type: ignore[arg-type]
        assert await client.prefetch() == 1
        await asyncio.sleep(0.2)  # the tasks run a few times
        assert all(not task.done() for task in client._tasks)
        assert len(client._tasks) == 2
        assert (await client.get("add", {"n": 65536})).match == "exact"
    assert [m["shape_key"] for m in httpx.get(f"{server.url}/v1/misses").json()] == ["n=5000"]
