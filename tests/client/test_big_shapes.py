"""A big shape of a real model is a key on the client's side too: its tuned config reaches the call.

Matmul 4096³ and attention 1×32×4096×4096×128 pass the client's own key check, and a best
config stored for them at the server is what ``get`` answers (``exact``), not the default.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tiletune.client import ConfigClient
from tiletune.client.keys import key_problem
from tiletune.kernels import client_settings

from .conftest import CHIP, LiveServer

MATMUL_4096 = {"m": 4096, "n": 4096, "k": 4096, "a_transposed": 0, "b_transposed": 0}
ATTENTION_4096 = {
    "batch": 1,
    "heads": 32,
    "kv_heads": 32,
    "seq_q": 4096,
    "seq_kv": 4096,
    "head_dim": 128,
    "causal": 0,
    "mask": 0,
}
MATMUL_CONFIG = {"tile_m": 64, "tile_n": 64, "tile_k": 32, "buffer_num": 2, "pipeline_depth": 2}
ATTENTION_CONFIG = {"block_q": 64, "block_kv": 64, "buffer_num": 2, "pipeline_depth": 2}
CASES = [("matmul", MATMUL_4096, MATMUL_CONFIG), ("fused_attention", ATTENTION_4096, ATTENTION_CONFIG)]


@pytest.mark.parametrize(("kernel", "shape", "config"), CASES, ids=["matmul", "attention"])
def test_a_big_shape_is_a_key_and_its_tuned_config_reaches_the_client(
    server: LiveServer, tmp_path: Path, kernel: str, shape: dict[str, int], config: dict[str, int]
) -> None:
    assert key_problem(kernel, shape, "float16") is None
    server.tune(kernel, shape, config)
    settings = client_settings(cache_dir=tmp_path / "cache", timeout_s=2.0, miss_flush_s=3600.0)
    with ConfigClient(server.url, CHIP, settings=settings) as client:
        tiling = client.get(kernel, shape, "float32")
    assert (tiling.match, dict(tiling.config)) == ("exact", config)
