"""The runtime client against the real server: every match kind, faults, caches, misses.

A counting transport wraps httpx's real one to see how many requests the
client made (the launch path's promise: few, and none after a prefetch).
"""

from __future__ import annotations

import http.server
import json
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from tests.credentials import ADMIN_TOKEN
from tiletune.client import AsyncConfigClient, ClientSettings, ConfigClient
from tiletune.client.chip import software_fingerprint
from tiletune.kernels import client_settings, get_kernel, launch, select_config
from tiletune.kernels.device import get_device

from .conftest import CHIP, LiveServer, free_port

ADD_CONFIG = {"tile_size": 4096, "buffer_num": 2, "pipeline_depth": 2}


class CountingTransport(httpx.HTTPTransport):
    """httpx's real transport, counting the requests that went out."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request.url.path)
        return super().handle_request(request)


def settings(tmp_path: Path, **overrides: object) -> ClientSettings:
    values: dict[str, object] = {"cache_dir": tmp_path / "cache", "timeout_s": 2.0, "miss_flush_s": 3600.0}
    values.update(overrides)
    return client_settings(**values)


def default_of(kernel: str, shape: dict[str, int], dtype: str = "float32") -> dict[str, int]:
    spec = get_kernel(kernel)
    return dict(spec.default_config(spec.parse_shape(shape), dtype, get_device("cpu").chip.limits))


@pytest.fixture
def counting() -> CountingTransport:
    return CountingTransport()


@pytest.fixture
def client(server: LiveServer, tmp_path: Path, counting: CountingTransport) -> Iterator[ConfigClient]:
    with ConfigClient(
        server.url, CHIP, token=ADMIN_TOKEN, settings=settings(tmp_path), transport=counting
    ) as made:
        yield made


def test_importing_the_client_loads_no_heavy_library() -> None:
    code = (
        "import sys, tiletune.client; "
        "print([m for m in ('torch', 'optuna', 'fastapi', 'sqlalchemy', 'numpy') if m in sys.modules])"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_a_tuned_key_is_exact_with_provenance_and_then_answered_from_memory(
    server: LiveServer, client: ConfigClient, counting: CountingTransport
) -> None:
    server.tune("add", {"n": 65536}, ADD_CONFIG)
    first = client.get("add", {"n": 65536})
    assert (dict(first.config), first.match, first.source) == (ADD_CONFIG, "exact", "server")
    assert first.best is not None
    assert first.best.default_ms == 3.0
    assert first.stale is None
    asked = len(counting.requests)
    for _ in range(100):
        assert client.get("add", {"n": 65536}) is first
    assert len(counting.requests) == asked


def test_an_untuned_shape_gets_the_nearest_tuned_one_then_the_default(
    server: LiveServer, client: ConfigClient
) -> None:
    server.tune("add", {"n": 65536}, ADD_CONFIG)
    near = client.get("add", {"n": 131072})
    assert near.match == "nearest"
    assert near.best is not None
    assert near.best.shape == {"n": 65536}
    other_dtype = client.get("add", {"n": 131072}, "float16")
    assert other_dtype.match == "default"
    assert dict(other_dtype.config) == default_of("add", {"n": 131072}, "float16")


def test_the_default_is_the_kernels_own_rule(client: ConfigClient) -> None:
    shape = {"rows": 64, "cols": 1000}
    answer = client.get("softmax", shape)
    assert answer.match == "default"
    assert dict(answer.config) == default_of("softmax", shape)


def test_nearest_never_crosses_a_categorical_dim(server: LiveServer, tmp_path: Path) -> None:
    shape = {
        "batch": 1,
        "heads": 4,
        "kv_heads": 4,
        "seq_q": 512,
        "seq_kv": 512,
        "head_dim": 64,
        "causal": 1,
        "mask": 0,
    }
    config = {"block_q": 64, "block_kv": 64, "buffer_num": 2, "pipeline_depth": 2}
    server.tune("fused_attention", shape, config)
    with ConfigClient(server.url, CHIP, token=ADMIN_TOKEN, settings=settings(tmp_path)) as client:
        assert client.prefetch() == 1
        assert client.get("fused_attention", {**shape, "seq_q": 1024}).match == "nearest"
        assert client.get("fused_attention", {**shape, "kv_heads": 1}).match == "nearest"  # a size dim
        for categorical in ({"causal": 0}, {"causal": 2}, {"mask": 1}):
            assert client.get("fused_attention", {**shape, **categorical}).match == "default", categorical


def test_after_a_prefetch_launches_make_no_http_call(
    server: LiveServer, client: ConfigClient, counting: CountingTransport
) -> None:
    server.tune("add", {"n": 65536}, ADD_CONFIG)
    server.tune("add", {"n": 4096}, {**ADD_CONFIG, "tile_size": 1024})
    assert client.prefetch() == 2
    before = len(counting.requests)
    answers = [client.get("add", {"n": n}) for n in (4096, 65536, 8192, 1 << 20)]
    assert [a.match for a in answers] == ["exact", "exact", "nearest", "nearest"]
    assert len(counting.requests) == before


def test_a_down_server_costs_one_attempt_then_a_back_off(tmp_path: Path) -> None:
    counting = CountingTransport()
    url = f"http://127.0.0.1:{free_port()}"  # nobody listens
    with ConfigClient(
        url, CHIP, token=ADMIN_TOKEN, settings=settings(tmp_path, backoff_s=60.0), transport=counting
    ) as client:
        answers = [client.get("add", {"n": 1024 * (i + 1)}) for i in range(50)]
    assert all(answer.match == "default" for answer in answers)
    assert counting.requests.count("/v1/configs/add") == 1


def test_a_slow_server_costs_one_timeout(tmp_path: Path) -> None:
    stop = threading.Event()

    class Slow(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            stop.wait(2.0)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *_args: object) -> None:
            pass

    slow = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=slow.serve_forever, daemon=True).start()
    try:
        client_settings = settings(tmp_path, timeout_s=0.2, backoff_s=60.0)
        with ConfigClient(f"http://127.0.0.1:{slow.server_port}", CHIP, settings=client_settings) as client:
            started = time.monotonic()
            first = client.get("add", {"n": 4096})
            rest = [client.get("add", {"n": 8192 * i}) for i in range(1, 20)]
            elapsed = time.monotonic() - started
        assert first.match == "default"
        assert all(answer.match == "default" for answer in rest)
        assert elapsed < 1.5  # one 0.2 s timeout, not twenty
    finally:
        stop.set()
        slow.shutdown()


def test_a_node_without_the_server_starts_from_its_disk_cache(server: LiveServer, tmp_path: Path) -> None:
    server.tune("add", {"n": 65536}, ADD_CONFIG)
    with ConfigClient(server.url, CHIP, token=ADMIN_TOKEN, settings=settings(tmp_path)) as online:
        online.prefetch()
    down = f"http://127.0.0.1:{free_port()}"
    with ConfigClient(down, CHIP, token=ADMIN_TOKEN, settings=settings(tmp_path)) as offline:
        answer = offline.get("add", {"n": 65536})
    assert (answer.match, answer.source, dict(answer.config)) == ("exact", "disk", ADD_CONFIG)


def test_a_corrupt_disk_cache_is_ignored_and_replaced(
    server: LiveServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server.tune("add", {"n": 65536}, ADD_CONFIG)
    with ConfigClient(None, CHIP, token=ADMIN_TOKEN, settings=settings(tmp_path)) as offline:
        assert offline.core.disk is not None
        path = offline.core.disk.path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"configs": [ this is not json')
    with (
        caplog.at_level(logging.WARNING),
        ConfigClient(None, CHIP, token=ADMIN_TOKEN, settings=settings(tmp_path)) as offline,
    ):
        assert offline.get("add", {"n": 65536}).match == "default"
    assert "unreadable config cache" in caplog.text
    with ConfigClient(server.url, CHIP, token=ADMIN_TOKEN, settings=settings(tmp_path)) as online:
        assert online.prefetch() == 1
    assert json.loads(path.read_text())["configs"][0]["config"] == ADD_CONFIG


SAVE_ONE = """
import sys
from datetime import UTC, datetime
from pathlib import Path
from tiletune.client.disk import DiskCache
from tiletune.client.wire import BestConfigPublic, ConfigBundle
folder, chip, start = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
cache = DiskCache(folder, chip)
for n in range(start, start + 20):
    entry = BestConfigPublic(kernel="add", kernel_version=1, shape={"n": n}, shape_key=f"n={n}",
        dtype="float32", chip=chip, config={"tile_size": 256, "buffer_num": 1, "pipeline_depth": 1},
        median_ms=1.0, promoted_at=datetime.now(UTC))
    assert cache.save(ConfigBundle(chip=chip, configs=[entry]))
"""


def test_processes_sharing_a_disk_cache_lose_no_entry(tmp_path: Path) -> None:
    folder = tmp_path / "shared"
    writers = [
        subprocess.Popen([sys.executable, "-c", SAVE_ONE, str(folder), CHIP, str(1000 * (i + 1))])
        for i in range(4)
    ]
    assert [writer.wait(timeout=120) for writer in writers] == [0, 0, 0, 0]
    with ConfigClient(None, CHIP, token=ADMIN_TOKEN, settings=settings(tmp_path, cache_dir=folder)) as reader:
        reader.core.load_disk()
        assert len(reader.core.known) == 80


def test_stale_entries_are_used_and_marked_other_versions_never(
    server: LiveServer, client: ConfigClient, tmp_path: Path
) -> None:
    old_software = {**software_fingerprint(), "torch": "1.0.0"}
    server.tune("add", {"n": 65536}, ADD_CONFIG, software=old_software)
    server.tune("add", {"n": 4096}, ADD_CONFIG)
    stale = client.get("add", {"n": 65536})
    assert stale.match == "exact"
    assert stale.stale is not None
    assert "torch 1.0.0" in stale.stale
    # A process that runs another version of the kernel than the one tuned (the server's, 1).
    newer = settings(tmp_path / "newer", kernel_versions={"add": 99})
    with ConfigClient(server.url, CHIP, token=ADMIN_TOKEN, settings=newer) as other:
        other_version = other.get("add", {"n": 4096})
    assert other_version.match != "exact"


def test_bundles_move_configs_to_an_air_gapped_node(server: LiveServer, tmp_path: Path) -> None:
    server.tune("add", {"n": 65536}, ADD_CONFIG)
    bundle = tmp_path / "bundle.json"
    with ConfigClient(server.url, CHIP, token=ADMIN_TOKEN, settings=settings(tmp_path / "a")) as online:
        online.prefetch()
        assert online.export_bundle(bundle) == 1
    with ConfigClient(None, CHIP, token=ADMIN_TOKEN, settings=settings(tmp_path / "b")) as gapped:
        assert gapped.import_bundle(bundle) == 1
        assert gapped.get("add", {"n": 65536}).match == "exact"


def test_misses_are_reported_in_batches_and_queue_tuning(server: LiveServer, client: ConfigClient) -> None:
    for _ in range(2):
        for n in (5000, 6000):
            client.core.forget_answers()
            client.get("add", {"n": n})
    assert client.flush_misses()
    misses = {m["shape_key"]: m for m in httpx.get(f"{server.url}/v1/misses").json()}
    assert misses["n=5000"]["count"] == 2
    assert misses["n=5000"]["job_id"] is None
    client.core.forget_answers()
    client.get("add", {"n": 5000})
    client.flush_misses()
    queued = {m["shape_key"]: m for m in httpx.get(f"{server.url}/v1/misses").json()}["n=5000"]
    assert queued["count"] == 3
    assert queued["job_id"] is not None  # the server's policy queued a job at the third miss


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_the_async_client_answers_like_the_sync_one(server: LiveServer, tmp_path: Path) -> None:
    server.tune("add", {"n": 65536}, ADD_CONFIG)
    transport = httpx.ASGITransport(app=server.app)
    async with AsyncConfigClient(
        "http://tiletune", CHIP, token=ADMIN_TOKEN, settings=settings(tmp_path), transport=transport
    ) as client:
        exact = await client.get("add", {"n": 65536})
        assert (exact.match, dict(exact.config)) == ("exact", ADD_CONFIG)
        assert (await client.get("add", {"n": 131072})).match == "nearest"
        assert (await client.get("softmax", {"rows": 8, "cols": 8})).match == "default"
        assert await client.prefetch() == 1
        assert await client.flush_misses()
    misses = httpx.get(f"{server.url}/v1/misses").json()
    assert {m["shape_key"] for m in misses} == {"n=131072", "rows=8,cols=8"}


def test_a_key_tuned_after_a_miss_is_picked_up_at_the_recheck(server: LiveServer, tmp_path: Path) -> None:
    with ConfigClient(
        server.url, CHIP, token=ADMIN_TOKEN, settings=settings(tmp_path, recheck_s=0.05)
    ) as client:
        assert client.get("add", {"n": 65536}).match == "default"
        server.tune("add", {"n": 65536}, ADD_CONFIG)
        assert client.get("add", {"n": 65536}).match == "default"  # remembered until the recheck
        time.sleep(0.1)
        assert client.core.expire() == 1  # what the client's background thread does
        assert client.get("add", {"n": 65536}).match == "exact"


def test_a_kernel_launch_takes_its_tiling_from_the_client(server: LiveServer, client: ConfigClient) -> None:
    spec = get_kernel("add")
    a, b = spec.make_inputs({"n": 65536}, "float32", get_device("cpu").torch_device)
    server.tune("add", {"n": 65536}, ADD_CONFIG)
    chosen = select_config("add", a, b, client=client)
    assert (chosen.source, chosen.config) == ("client", ADD_CONFIG)
    torch.testing.assert_close(launch("add", a, b, client=client), a + b)


def test_a_background_refresh_brings_new_configs(server: LiveServer, tmp_path: Path) -> None:
    with ConfigClient(
        server.url, CHIP, token=ADMIN_TOKEN, settings=settings(tmp_path, refresh_s=0.1)
    ) as client:
        assert client.prefetch() == 0
        assert client.get("add", {"n": 65536}).match == "default"
        server.tune("add", {"n": 65536}, ADD_CONFIG)
        deadline = time.monotonic() + 10
        while client.get("add", {"n": 65536}).match != "exact" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.get("add", {"n": 65536}).match == "exact"


def test_a_shape_that_leaves_out_dims_with_defaults_is_the_full_key(
    server: LiveServer, tmp_path: Path
) -> None:
    """After a prefetch the client fills ``kv_heads`` (``heads``) and ``mask`` (0) as the server
    does: an old-form attention shape is the tuned key, and its neighbours are near it."""
    old_form = {"batch": 1, "heads": 4, "seq_q": 512, "seq_kv": 512, "head_dim": 64, "causal": 1}
    config = {"block_q": 64, "block_kv": 64, "buffer_num": 2, "pipeline_depth": 2}
    server.tune("fused_attention", {**old_form, "kv_heads": 4, "mask": 0}, config)
    with ConfigClient(server.url, CHIP, token=ADMIN_TOKEN, settings=settings(tmp_path)) as client:
        assert client.prefetch() == 1
        answer = client.get("fused_attention", old_form)
        assert (answer.match, dict(answer.config)) == ("exact", config)
        assert client.get("fused_attention", {**old_form, "seq_q": 1024}).match == "nearest"
