"""The default heuristic per kernel, the constraints that shape the space, input errors naming the field."""

from __future__ import annotations

import itertools

import pytest

from tests.kernels.cases import TILED_FAMILIES
from tiletune.kernels.declaration import Shape
from tiletune.kernels.device import cpu_chip
from tiletune.kernels.errors import ConfigError, ShapeError
from tiletune.kernels.registry import builtin_kernels
from tiletune.kernels.spec import DeviceLimits

KERNELS = builtin_kernels()
LIMITS = DeviceLimits(local_memory_bytes=1024 * 1024)
#: Small enough that ``1024 * 4 bytes * 2 buffers`` exceeds a third of it: the rule falls back to 512.
TINY = DeviceLimits(local_memory_bytes=16 * 1024)

# (kernel, shape as a client writes it, limits, expected default): one row per branch of the rule and
# kernel. The shapes leave out the dims that have a default (parse_shape fills them, as the server does).
DEFAULTS = [
    ("add", {"n": 1000}, LIMITS, {"tile_size": 1000, "buffer_num": 1, "pipeline_depth": 1}),
    ("add", {"n": 50_000}, LIMITS, {"tile_size": 256, "buffer_num": 2, "pipeline_depth": 2}),
    ("add", {"n": 1 << 20}, LIMITS, {"tile_size": 1024, "buffer_num": 2, "pipeline_depth": 3}),
    ("add", {"n": 1 << 20}, TINY, {"tile_size": 512, "buffer_num": 2, "pipeline_depth": 3}),
    (
        "softmax",
        {"rows": 20, "cols": 50},
        LIMITS,
        {"tile_rows": 20, "tile_cols": 50, "buffer_num": 1, "pipeline_depth": 1},
    ),
    (
        "softmax",
        {"rows": 1000, "cols": 64},
        LIMITS,
        {"tile_rows": 4, "tile_cols": 64, "buffer_num": 2, "pipeline_depth": 2},
    ),
    (
        "softmax",
        {"rows": 100, "cols": 500},
        LIMITS,
        {"tile_rows": 1, "tile_cols": 256, "buffer_num": 2, "pipeline_depth": 2},
    ),
    (
        "softmax",
        {"rows": 4096, "cols": 4096},
        LIMITS,
        {"tile_rows": 1, "tile_cols": 1024, "buffer_num": 2, "pipeline_depth": 3},
    ),
    (
        "rms_norm",
        {"rows": 4096, "cols": 256},
        LIMITS,
        {"tile_rows": 4, "tile_cols": 256, "buffer_num": 2, "pipeline_depth": 3},
    ),
    (
        "rms_norm",
        {"rows": 4096, "cols": 256},
        TINY,
        {"tile_rows": 2, "tile_cols": 256, "buffer_num": 2, "pipeline_depth": 3},
    ),
    (
        "matmul",
        {"m": 30, "n": 30, "k": 40},
        LIMITS,
        {"tile_m": 30, "tile_n": 30, "tile_k": 40, "buffer_num": 1, "pipeline_depth": 1},
    ),
    (
        "matmul",
        {"m": 30, "n": 30, "k": 1000},
        LIMITS,
        {"tile_m": 30, "tile_n": 30, "tile_k": 512, "buffer_num": 1, "pipeline_depth": 1},
    ),
    (
        "matmul",
        {"m": 200, "n": 200, "k": 200},
        LIMITS,
        {"tile_m": 16, "tile_n": 16, "tile_k": 16, "buffer_num": 2, "pipeline_depth": 2},
    ),
    (
        "matmul",
        {"m": 1024, "n": 1024, "k": 1024},
        LIMITS,
        {"tile_m": 32, "tile_n": 32, "tile_k": 32, "buffer_num": 2, "pipeline_depth": 3},
    ),
    (
        "matmul",
        {"m": 1024, "n": 1024, "k": 1024},
        TINY,
        {"tile_m": 16, "tile_n": 16, "tile_k": 16, "buffer_num": 2, "pipeline_depth": 3},
    ),
    (
        "fused_attention",
        {"batch": 2, "heads": 8, "seq_q": 32, "seq_kv": 20, "head_dim": 64, "causal": 1},
        LIMITS,
        {"block_q": 32, "block_kv": 20, "buffer_num": 1, "pipeline_depth": 1},
    ),
    (
        "fused_attention",
        {"batch": 1, "heads": 8, "seq_q": 128, "seq_kv": 128, "head_dim": 64, "causal": 0},
        LIMITS,
        {"block_q": 16, "block_kv": 16, "buffer_num": 2, "pipeline_depth": 2},
    ),
    (
        "fused_attention",
        {"batch": 1, "heads": 4, "seq_q": 1024, "seq_kv": 1024, "head_dim": 64, "causal": 0},
        LIMITS,
        {"block_q": 32, "block_kv": 32, "buffer_num": 2, "pipeline_depth": 3},
    ),
    (
        "fused_attention",
        {
            "batch": 1,
            "heads": 8,
            "kv_heads": 2,
            "seq_q": 128,
            "seq_kv": 128,
            "head_dim": 64,
            "causal": 2,
            "mask": 1,
        },
        LIMITS,
        {"block_q": 16, "block_kv": 16, "buffer_num": 2, "pipeline_depth": 2},
    ),
]

RAW_TYPICAL: dict[str, list[dict[str, int]]] = {
    "add": [{"n": 1 << 24}, {"n": 100_000}, {"n": 3}],
    "softmax": [{"rows": 4096, "cols": 4096}, {"rows": 8, "cols": 32768}, {"rows": 7, "cols": 9}],
    "softmax_backward": [{"rows": 4096, "cols": 4096}, {"rows": 8192, "cols": 1024}, {"rows": 7, "cols": 9}],
    "rms_norm": [{"rows": 4096, "cols": 4096}, {"rows": 16384, "cols": 1024}],
    "rms_norm_backward": [{"rows": 4096, "cols": 4096}, {"rows": 8192, "cols": 1024}, {"rows": 7, "cols": 9}],
    "matmul": [{"m": 1024, "n": 1024, "k": 1024}, {"m": 4096, "n": 128, "k": 4096}, {"m": 5, "n": 5, "k": 5}],
    "fused_attention": [
        {"batch": 1, "heads": 4, "seq_q": 2048, "seq_kv": 2048, "head_dim": 64, "causal": 1},
        {"batch": 8, "heads": 16, "seq_q": 512, "seq_kv": 512, "head_dim": 128, "causal": 0},
        {
            "batch": 4,
            "heads": 32,
            "kv_heads": 8,
            "seq_q": 1,
            "seq_kv": 4096,
            "head_dim": 128,
            "causal": 2,
            "mask": 1,
        },
    ],
    "fused_attention_backward": [
        {"batch": 1, "heads": 8, "kv_heads": 2, "seq_q": 2048, "seq_kv": 2048, "head_dim": 64, "causal": 1},
        {"batch": 8, "heads": 16, "seq_q": 512, "seq_kv": 512, "head_dim": 128, "causal": 0, "mask": 1},
        {"batch": 2, "heads": 4, "seq_q": 100, "seq_kv": 300, "head_dim": 64, "causal": 2},
    ],
}
#: Every dim given (the shapes the spec's methods take).
TYPICAL: dict[str, list[Shape]] = {
    name: [KERNELS[name].parse_shape(raw) for raw in shapes] for name, shapes in RAW_TYPICAL.items()
}


@pytest.mark.parametrize(
    ("name", "raw", "filled"),
    [
        (
            "fused_attention",
            {"batch": 2, "heads": 8, "seq_q": 3, "seq_kv": 5, "head_dim": 16, "causal": 1},
            {"kv_heads": 8, "mask": 0},
        ),
        (
            "fused_attention",
            {"batch": 2, "heads": 8, "kv_heads": 2, "seq_q": 3, "seq_kv": 5, "head_dim": 16, "causal": 2},
            {"mask": 0},
        ),
        ("matmul", {"m": 4, "n": 5, "k": 6}, {"a_transposed": 0, "b_transposed": 0}),
        ("matmul", {"m": 4, "n": 5, "k": 6, "b_transposed": 1}, {"a_transposed": 0}),
    ],
)
def test_parse_shape_fills_left_out_dims_with_their_defaults(
    name: str, raw: dict[str, int], filled: dict[str, int]
) -> None:
    spec = KERNELS[name]
    shape = spec.parse_shape(raw)
    assert shape == {**raw, **filled}
    assert list(shape) == [d.name for d in spec.dims]
    key = spec.canonical_shape(shape)  # the server's key: every dim, left-out ones too
    assert [part.split("=") for part in key.split(",")] == [[d.name, str(shape[d.name])] for d in spec.dims]
    assert spec.parse_shape(shape) == shape  # a full shape parses to itself


@pytest.mark.parametrize(("name", "shape", "limits", "expected"), DEFAULTS)
def test_default_follows_the_hand_written_rule(
    name: str, shape: Shape, limits: DeviceLimits, expected: dict[str, int]
) -> None:
    spec = KERNELS[name]
    assert spec.default_config(spec.parse_shape(shape), "float32", limits) == expected


@pytest.mark.parametrize("name", TILED_FAMILIES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_default_is_a_member_of_the_knob_values_and_valid_here(name: str, dtype: str) -> None:
    spec = KERNELS[name]
    for shape in TYPICAL[name]:
        default = spec.default_config(shape, dtype, cpu_chip().limits)
        assert spec.parse_config(default, shape) == default
        assert spec.invalid_reason(default, shape, dtype, cpu_chip().limits) is None
        assert default in spec.space(shape, dtype, cpu_chip().limits)


@pytest.mark.parametrize("name", TILED_FAMILIES)
def test_space_holds_exactly_the_valid_configs(name: str) -> None:
    spec = KERNELS[name]
    limits = DeviceLimits(local_memory_bytes=64 * 1024, max_buffer_num=3)
    shape = TYPICAL[name][0]
    space = spec.space(shape, "float32", limits)
    values = spec.knob_values(shape)
    every = [dict(zip(values, combo, strict=True)) for combo in itertools.product(*values.values())]
    valid = [c for c in every if spec.invalid_reason(c, shape, "float32", limits) is None]
    assert space == valid
    assert 0 < len(space) < len(every)
    assert all(spec.working_set_bytes(c, shape, "float32") <= limits.local_memory_bytes for c in space)
    assert all(c["buffer_num"] <= 3 and (c["pipeline_depth"] == 1 or c["buffer_num"] >= 2) for c in space)


def largest(name: str, shape: Shape, buffer_num: int, depth: int) -> dict[str, int]:
    values = KERNELS[name].knob_values(shape)
    config = {knob: max(v) for knob, v in values.items()}
    return {**config, "buffer_num": buffer_num, "pipeline_depth": depth}


@pytest.mark.parametrize("name", TILED_FAMILIES)
def test_constraints_reject_with_a_reason(name: str) -> None:
    spec = KERNELS[name]
    shape = TYPICAL[name][0]
    too_big = largest(name, shape, 4, 3)
    assert "exceeds local memory" in (spec.invalid_reason(too_big, shape, "float32", LIMITS) or "")
    smallest = {knob: min(v) for knob, v in spec.knob_values(shape).items()}
    single = {**smallest, "buffer_num": 1, "pipeline_depth": 2}
    assert "needs buffer_num >= 2" in (spec.invalid_reason(single, shape, "float32", LIMITS) or "")
    many = {**smallest, "buffer_num": 4, "pipeline_depth": 2}
    two_buffers = DeviceLimits(local_memory_bytes=LIMITS.local_memory_bytes, max_buffer_num=2)
    assert "exceeds the chip's 2 buffers" in (spec.invalid_reason(many, shape, "float32", two_buffers) or "")


@pytest.mark.parametrize("name", TILED_FAMILIES)
def test_working_set_counts_every_buffer_slot(name: str) -> None:
    spec = KERNELS[name]
    shape = TYPICAL[name][0]
    one, two = largest(name, shape, 1, 1), largest(name, shape, 2, 1)
    assert spec.working_set_bytes(two, shape, "float32") > spec.working_set_bytes(one, shape, "float32")


def test_attention_working_set_is_per_batch_and_head() -> None:
    spec = KERNELS["fused_attention"]
    config = {"block_q": 64, "block_kv": 128, "buffer_num": 2, "pipeline_depth": 2}
    small = {
        "batch": 1,
        "heads": 1,
        "kv_heads": 1,
        "seq_q": 512,
        "seq_kv": 512,
        "head_dim": 64,
        "causal": 0,
        "mask": 0,
    }
    small_bytes = spec.working_set_bytes(config, small, "float32")
    for large in ({**small, "batch": 8, "heads": 32, "kv_heads": 32}, {**small, "heads": 32, "kv_heads": 4}):
        assert spec.working_set_bytes(config, large, "float32") == small_bytes
    # a mask adds its blocks: buffer_num of block_q x block_kv
    masked = spec.working_set_bytes(config, {**small, "mask": 1}, "float32")
    assert masked == small_bytes + 2 * 64 * 128 * 4


@pytest.mark.parametrize(
    ("name", "raw", "field", "words"),
    [
        ("add", {}, "shape", "missing ['n']"),
        ("add", {"n": 4, "m": 2}, "shape", "no dim(s) ['m']"),
        ("add", {"n": 0}, "shape.n", "positive"),
        ("softmax", {"rows": -3, "cols": 4}, "shape.rows", "positive"),
        ("matmul", {"m": 4, "n": 4, "k": "4"}, "shape.k", "integer"),
        ("matmul", {"m": 4, "n": 4, "k": 4, "a_transposed": 2}, "shape.a_transposed", "one of [0, 1]"),
        ("matmul", {"n": 4, "k": 4, "b_transposed": 1}, "shape", "missing ['m']"),
        (
            "fused_attention",
            {"batch": 1, "heads": 1, "seq_q": 4, "seq_kv": 4, "head_dim": 4, "causal": 3},
            "shape.causal",
            "one of [0, 1, 2]",
        ),
        (
            "fused_attention",
            {"batch": 1, "heads": 1, "seq_q": 4, "seq_kv": 4, "head_dim": 4, "causal": 0, "mask": 2},
            "shape.mask",
            "one of [0, 1]",
        ),
        (
            "fused_attention",
            {"batch": 1, "heads": 4, "kv_heads": 3, "seq_q": 4, "seq_kv": 4, "head_dim": 4, "causal": 0},
            "shape.kv_heads",
            "must divide heads (4), got 3",
        ),
        (
            "fused_attention",
            {"batch": 1, "kv_heads": 1, "seq_q": 4, "seq_kv": 4, "head_dim": 4},
            "shape",
            "missing ['heads', 'causal']",
        ),
    ],
)
def test_bad_shapes_name_the_field(name: str, raw: dict[str, object], field: str, words: str) -> None:
    with pytest.raises(ShapeError) as caught:
        KERNELS[name].parse_shape(raw)
    assert caught.value.field == field
    assert words in caught.value.reason


@pytest.mark.parametrize(
    ("name", "shape", "raw", "field", "words"),
    [
        (
            "add",
            {"n": 1000},
            {"tile_size": 300, "buffer_num": 2, "pipeline_depth": 2},
            "config.tile_size",
            "outside the space",
        ),
        (
            "add",
            {"n": 1000},
            {"tile_size": 2048, "buffer_num": 2, "pipeline_depth": 2},
            "config.tile_size",
            "[256, 512, 1000]",
        ),
        ("add", {"n": 1000}, {"tile_size": 256, "buffer_num": 2}, "config", "missing ['pipeline_depth']"),
        (
            "softmax",
            {"rows": 8, "cols": 8},
            {"tile_rows": 8, "tile_cols": 8, "buffer_num": 1, "pipeline_depth": 1, "x": 1},
            "config",
            "unknown ['x']",
        ),
        (
            "matmul",
            {"m": 64, "n": 64, "k": 64, "a_transposed": 0, "b_transposed": 0},
            {"tile_m": 64, "tile_n": 64, "tile_k": 64, "buffer_num": 5, "pipeline_depth": 1},
            "config.buffer_num",
            "outside",
        ),
    ],
)
def test_bad_configs_name_the_knob(
    name: str, shape: Shape, raw: dict[str, object], field: str, words: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        KERNELS[name].parse_config(raw, shape)
    assert caught.value.field == field
    assert words in caught.value.reason
