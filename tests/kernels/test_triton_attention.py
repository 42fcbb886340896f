"""``triton_fused_attention``'s kernel against an explicit float32 attention, in Triton's interpreter.

Covers both causal alignments with ``seq_q`` equal to, shorter and longer than ``seq_kv``,
grouped-query attention, broadcast and strided additive masks (with a fully masked row), a
custom scale, blocks that do not divide the sequences and a ``head_dim`` that is not a power of
two; the log-sum-exp is checked with the output. Shapes stay small: the interpreter is slow.
"""

from __future__ import annotations

import math

import pytest
import torch

from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.errors import ShapeError
from tiletune.kernels.fused_attention.triton import SPEC
from tiletune.kernels.triton.spec import triton_installed

pytestmark = pytest.mark.skipif(not triton_installed(), reason="triton is not installed (tiletune[triton])")

BLOCKS_16: Config = {"block_q": 16, "block_kv": 16, "num_stages": 1, "num_warps": 4}


def attention_shape(
    seq_q: int,
    seq_kv: int,
    *,
    causal: int = 0,
    heads: int = 2,
    kv_heads: int | None = None,
    head_dim: int = 16,
    batch: int = 1,
    mask: int = 0,
) -> Shape:
    return {
        "batch": batch,
        "heads": heads,
        "kv_heads": heads if kv_heads is None else kv_heads,
        "seq_q": seq_q,
        "seq_kv": seq_kv,
        "head_dim": head_dim,
        "causal": causal,
        "mask": mask,
    }


def make_qkv(shape: Shape, dtype: torch.dtype = torch.float32, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    b, d = shape["batch"], shape["head_dim"]
    sizes = [
        (b, shape["heads"], shape["seq_q"], d),
        (b, shape["kv_heads"], shape["seq_kv"], d),
        (b, shape["kv_heads"], shape["seq_kv"], d),
    ]
    return [torch.randn(size, generator=generator).to(dtype) for size in sizes]


def reference(inputs: list[torch.Tensor], causal: int, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Explicit float32 attention: ``softmax(q k^T * scale + mask) v`` and the rows' logsumexp."""
    q, k, v = (t.float() for t in inputs[:3])
    heads, kv_heads, seq_q, seq_kv = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
    kv_head = torch.arange(heads) // (heads // kv_heads)
    k, v = k[:, kv_head], v[:, kv_head]
    scores = q @ k.transpose(-2, -1) * scale
    if len(inputs) > 3:
        scores = scores + inputs[3].float()
    if causal:
        offset = 0 if causal == 1 else seq_kv - seq_q
        hidden = torch.arange(seq_kv)[None, :] > torch.arange(seq_q)[:, None] + offset
        scores = scores.masked_fill(hidden, -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    empty = torch.isneginf(lse)[..., None]
    probs = torch.where(empty, 0.0, torch.exp(scores - torch.where(empty, 0.0, lse[..., None])))
    return probs @ v, lse


def check(
    inputs: list[torch.Tensor],
    shape: Shape,
    config: Config = BLOCKS_16,
    scale: float | None = None,
    tolerance: float = 2e-5,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the kernel, compare with :func:`reference`; return its ``(out, lse)``."""
    out, lse = SPEC.attend(inputs, config, shape, scale=scale)
    expected_out, expected_lse = reference(
        inputs, shape["causal"], shape["head_dim"] ** -0.5 if scale is None else scale
    )
    assert out.shape == inputs[0].shape
    assert out.dtype == inputs[0].dtype
    assert lse.shape == inputs[0].shape[:3]
    assert lse.dtype == torch.float32
    assert not out.isnan().any()
    assert not lse.isnan().any()
    torch.testing.assert_close(out.float(), expected_out, atol=tolerance, rtol=tolerance)
    torch.testing.assert_close(lse, expected_lse, atol=tolerance, rtol=tolerance)
    return out, lse


@pytest.mark.parametrize("causal", [0, 1, 2])
@pytest.mark.parametrize(("seq_q", "seq_kv"), [(24, 24), (20, 45), (40, 18)])
def test_causal_alignments_match_the_reference(causal: int, seq_q: int, seq_kv: int) -> None:
    shape = attention_shape(seq_q, seq_kv, causal=causal)
    check(make_qkv(shape), shape)


def test_bottom_right_rows_that_see_no_key_are_zero_with_lse_minus_infinity() -> None:
    shape = attention_shape(40, 18, causal=2)
    out, lse = check(make_qkv(shape), shape)
    hidden_rows = 40 - 18  # query i sees keys j <= i - 22: none for i < 22
    assert torch.equal(out[:, :, :hidden_rows], torch.zeros_like(out[:, :, :hidden_rows]))
    assert torch.isneginf(lse[:, :, :hidden_rows]).all()
    assert torch.isfinite(lse[:, :, hidden_rows:]).all()


def test_bottom_right_differs_from_top_left_when_lengths_differ() -> None:
    shape = attention_shape(20, 45, causal=1)
    inputs = make_qkv(shape)
    top_left, _ = SPEC.attend(inputs, BLOCKS_16, shape)
    bottom_right, _ = SPEC.attend(inputs, BLOCKS_16, {**shape, "causal": 2})
    assert not torch.allclose(top_left, bottom_right)


@pytest.mark.parametrize("kv_heads", [2, 1])
@pytest.mark.parametrize("causal", [0, 2])
def test_grouped_query_heads_read_their_groups_kv_head(kv_heads: int, causal: int) -> None:
    shape = attention_shape(21, 37, causal=causal, heads=4, kv_heads=kv_heads, batch=2)
    check(make_qkv(shape), shape, {"block_q": 16, "block_kv": 32, "num_stages": 2, "num_warps": 4})


@pytest.mark.parametrize("causal", [0, 1])
def test_a_broadcast_mask_is_added_and_a_fully_masked_row_is_empty(causal: int) -> None:
    shape = attention_shape(19, 35, causal=causal, heads=2, batch=2, mask=1)
    generator = torch.Generator().manual_seed(1)
    mask = torch.randn(1, 2, 19, 35, generator=generator)  # broadcast over the batch
    mask[:, :, :, 30:] = -math.inf  # keys past 30 hidden from every query
    mask[:, 1, 5] = -math.inf  # head 1's query 5 sees nothing
    mask[:, 0, 2, :20] = -math.inf  # head 0's query 2 sees no key of the first kv block
    out, lse = check([*make_qkv(shape), mask], shape)
    assert torch.equal(out[:, 1, 5], torch.zeros_like(out[:, 1, 5]))
    assert torch.isneginf(lse[:, 1, 5]).all()
    assert torch.isfinite(lse[:, 0, 5]).all()


def test_a_mask_is_read_through_its_strides() -> None:
    shape = attention_shape(18, 33, causal=2, heads=2, batch=2, mask=1)
    generator = torch.Generator().manual_seed(2)
    per_batch = torch.randn(2, 1, 33, 18, generator=generator).transpose(-2, -1)  # not contiguous
    check([*make_qkv(shape), per_batch], shape)
    per_position = torch.randn(18, 33, generator=generator).expand(1, 1, 18, 33)  # a view, strides 0
    check([*make_qkv(shape), per_position], shape)


def test_a_custom_scale_replaces_the_default() -> None:
    shape = attention_shape(30, 30, causal=1)
    inputs = make_qkv(shape)
    out, _ = check(inputs, shape, scale=0.3)
    default, _ = SPEC.attend(inputs, BLOCKS_16, shape)
    assert not torch.allclose(out, default)


def test_head_dim_not_a_power_of_two() -> None:
    shape = attention_shape(25, 20, causal=2, head_dim=24, kv_heads=1)
    check(make_qkv(shape), shape)


def test_float16_inputs_keep_their_dtype() -> None:
    shape = attention_shape(33, 47, causal=2, heads=4, kv_heads=2, head_dim=40, mask=1)
    mask = torch.zeros(1, 1, 33, 47, dtype=torch.float16)
    mask[..., ::3] = -1.5
    check([*make_qkv(shape, torch.float16), mask], shape, tolerance=3e-3)


def test_run_returns_the_output_of_attend() -> None:
    shape = attention_shape(17, 17, causal=1)
    inputs = make_qkv(shape)
    out, _ = SPEC.attend(inputs, BLOCKS_16, shape)
    torch.testing.assert_close(SPEC.run(inputs, BLOCKS_16, shape), out, atol=0.0, rtol=0.0)


def test_heads_that_do_not_group_over_the_kv_heads_are_refused() -> None:
    shape = attention_shape(16, 16, heads=3, kv_heads=2)
    with pytest.raises(ValueError, match="3 query heads do not split into groups over 2 kv heads"):
        SPEC.attend(make_qkv(shape), BLOCKS_16, shape)


def test_a_mask_that_does_not_broadcast_or_is_missing_is_refused() -> None:
    shape = attention_shape(16, 16, mask=1)
    inputs = make_qkv(shape)
    with pytest.raises(ValueError, match=r"mask of size \[1, 2, 16, 8\] does not broadcast"):
        SPEC.attend([*inputs, torch.zeros(1, 2, 16, 8)], BLOCKS_16, shape)
    with pytest.raises(ShapeError):
        SPEC.attend(inputs, BLOCKS_16, shape)
