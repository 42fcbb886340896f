"""The five built-in kernels: every valid config agrees with the reference, on shapes tiles do not divide."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.kernels.cases import NATIVE_KERNELS, TILED_FAMILIES, TRITON_KERNELS, one_tensor
from tiletune.kernels.declaration import Shape
from tiletune.kernels.device import cpu_chip
from tiletune.kernels.family import builtin_families
from tiletune.kernels.registry import builtin_kernels

from .cases import CPU, DIM_BOUNDS, SHAPES, assert_matches_reference, with_grouping

KERNELS = builtin_kernels()
LIMITS = cpu_chip().limits


def test_every_builtin_family_exposes_a_versioned_spec_per_implementation() -> None:
    tiled = zip(TILED_FAMILIES, NATIVE_KERNELS, TRITON_KERNELS, strict=True)
    assert [name for name in KERNELS if name != "compiled_matmul"] == [k for names in tiled for k in names]
    changed = {"matmul", "fused_attention"}  # version 2: layout dims; kv_heads, mask and causal=2
    for name in TILED_FAMILIES:
        for implementation in builtin_families()[name].implementations:
            spec = KERNELS[implementation.kernel]
            assert spec.version == (2 if name in changed else 1), spec.name
            own = implementation.backend == "torch"  # the portable spec also runs the native C++
            assert spec.backends() == (("torch", "native") if own else (implementation.backend,))


@pytest.mark.parametrize("name", TILED_FAMILIES)
def test_a_sample_of_valid_configs_matches_the_reference_in_float32(name: str) -> None:
    spec = KERNELS[name]
    rng = random.Random(name)
    for shape in SHAPES[name]:
        space = spec.space(shape, "float32", LIMITS)
        assert space, shape
        sample = [*rng.sample(space, min(10, len(space))), spec.default_config(shape, "float32", LIMITS)]
        assert_matches_reference(spec, shape, "float32", sample)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", TILED_FAMILIES)
def test_low_precision_configs_match_the_reference(name: str, dtype: str) -> None:
    spec = KERNELS[name]
    shape = SHAPES[name][1]
    space = spec.space(shape, dtype, LIMITS)
    assert_matches_reference(spec, shape, dtype, random.Random(dtype).sample(space, min(4, len(space))))


@st.composite
def shapes_and_configs(draw: st.DrawFn, name: str) -> tuple[Shape, dict[str, int], str]:
    spec = KERNELS[name]
    shape = with_grouping(
        {
            dim.name: draw(
                st.sampled_from(dim.choices) if dim.choices else st.integers(1, DIM_BOUNDS[name][dim.name])
            )
            for dim in spec.dims
        }
    )
    dtype = draw(st.sampled_from(["float32", "float32", "float16", "bfloat16"]))
    config = draw(st.sampled_from(spec.space(shape, dtype, LIMITS)))
    return shape, config, dtype


@pytest.mark.parametrize("name", TILED_FAMILIES)
def test_random_shapes_and_valid_configs_match_the_reference(name: str) -> None:
    @settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
    @given(case=shapes_and_configs(name))
    def check(case: tuple[Shape, dict[str, int], str]) -> None:
        shape, config, dtype = case
        assert_matches_reference(KERNELS[name], shape, dtype, [config])

    check()


@pytest.mark.parametrize("name", TILED_FAMILIES)
def test_inputs_are_deterministic_per_seed(name: str) -> None:
    spec = KERNELS[name]
    shape = SHAPES[name][1]
    first, again, other = (spec.make_inputs(shape, "float32", CPU, seed=s) for s in (7, 7, 8))
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not torch.equal(first[0], other[0])


@pytest.mark.parametrize("name", TILED_FAMILIES)
def test_flops_and_bytes_are_positive_and_grow_with_the_shape(name: str) -> None:
    spec = KERNELS[name]
    small, large = SHAPES[name][0], SHAPES[name][-1]
    assert 0 < spec.flops(small) <= spec.flops(large)
    assert 0 < spec.bytes_moved(small, "float16") < spec.bytes_moved(small, "float32")


def test_an_unknown_backend_is_refused_with_the_choices() -> None:
    spec = KERNELS["add"]
    shape = {"n": 8}
    inputs = spec.make_inputs(shape, "float32", CPU)
    with pytest.raises(ValueError, match=r"backend.*'triton'.*torch"):
        spec.run(inputs, spec.default_config(shape, "float32", LIMITS), shape, backend="triton")


def attention_shape(seq_q: int, seq_kv: int, causal: int, *, heads: int = 2, kv_heads: int = 2) -> Shape:
    """A full ``fused_attention`` shape (every dim, no mask) of batch 1 and head_dim 8."""
    return {
        "batch": 1,
        "heads": heads,
        "kv_heads": kv_heads,
        "seq_q": seq_q,
        "seq_kv": seq_kv,
        "head_dim": 8,
        "causal": causal,
        "mask": 0,
    }


@pytest.mark.parametrize("causal", [1, 2])
def test_causal_attention_matches_torch_sdpa_alignment(causal: int) -> None:
    """Our reference (and so the kernel) masks like SDPA: ``causal=1`` as ``is_causal`` (top-left),
    ``causal=2`` as ``causal_lower_right`` (bottom-right), also for seq_q != seq_kv; a query that
    sees no key (bottom-right, seq_q > seq_kv) gives 0, as SDPA does."""
    spec = KERNELS["fused_attention"]
    for seq_q, seq_kv in ((20, 20), (12, 30), (30, 12)):
        shape = attention_shape(seq_q, seq_kv, causal)
        inputs = spec.make_inputs(shape, "float32", CPU)
        q, k, v = inputs
        if causal == 1:
            sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # causal_lower_right's mask, spelled out (torch warns of NaN for seq_q > seq_kv; it gives 0)
            visible = torch.ones(seq_q, seq_kv, dtype=torch.bool).tril(seq_kv - seq_q)
            sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=visible)
        torch.testing.assert_close(spec.reference(inputs, shape), sdpa, atol=1e-5, rtol=1e-5)
        config = {
            "block_q": min(16, seq_q),
            "block_kv": min(16, seq_kv),
            "buffer_num": 2,
            "pipeline_depth": 3,
        }
        torch.testing.assert_close(spec.run(inputs, config, shape), sdpa, atol=1e-5, rtol=1e-5)
    shape = attention_shape(12, 30, 1)
    inputs = spec.make_inputs(shape, "float32", CPU)
    top_left, bottom_right = (one_tensor(spec.reference(inputs, {**shape, "causal": c})) for c in (1, 2))
    assert not torch.allclose(top_left, bottom_right)  # the two alignments differ when seq_q != seq_kv


def test_grouped_query_attention_matches_torch_sdpa() -> None:
    """With ``kv_heads < heads`` each kv head serves ``heads / kv_heads`` query heads, as SDPA's
    ``enable_gqa``."""
    spec = KERNELS["fused_attention"]
    shape = attention_shape(20, 24, 1, heads=4, kv_heads=2)
    q, k, v = inputs = spec.make_inputs(shape, "float32", CPU)
    assert k.shape[1] == 2
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    config = {"block_q": 16, "block_kv": 16, "buffer_num": 2, "pipeline_depth": 3}
    torch.testing.assert_close(spec.run(inputs, config, shape), sdpa, atol=1e-5, rtol=1e-5)


def test_non_contiguous_inputs_give_the_same_result() -> None:
    shape = {**attention_shape(20, 24, 1, heads=3, kv_heads=3), "batch": 2}
    spec = KERNELS["fused_attention"]
    inputs = spec.make_inputs(shape, "float32", CPU)
    sequence_major = tuple(t.transpose(1, 2).contiguous().transpose(1, 2) for t in inputs)
    config = {"block_q": 16, "block_kv": 16, "buffer_num": 2, "pipeline_depth": 3}
    torch.testing.assert_close(spec.run(sequence_major, config, shape), spec.reference(inputs, shape))
    x = torch.randn(40, 30).t()
    config = {"tile_rows": 16, "tile_cols": 32, "buffer_num": 2, "pipeline_depth": 2}
    softmax = KERNELS["softmax"].run((x,), config, {"rows": 30, "cols": 40})
    torch.testing.assert_close(softmax, torch.softmax(x, -1))
