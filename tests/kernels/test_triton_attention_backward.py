"""``triton_fused_attention_backward``'s kernels against torch autograd, in Triton's interpreter.

The reference differentiates an explicit float64 attention (``softmax(q k^T * scale + mask) v`` and
its rows' log-sum-exp, a row that sees no key giving 0 and ``-inf``) with ``torch.autograd``, and
one test differentiates ``scaled_dot_product_attention``. The kernel gets that forward's ``out`` and
``lse`` (one test chains the Triton forward instead). Covers both causal alignments with ``seq_q``
equal to, shorter and longer than ``seq_kv``, grouped-query attention, broadcast and strided additive
masks with fully masked rows, a gradient of the log-sum-exp, a custom scale, a ``head_dim`` that is
not a power of two, float16, and every valid block/stage pair of a shape the blocks do not divide.
Shapes stay small: the interpreter is slow.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn.functional import scaled_dot_product_attention

from tiletune.client.space import DeviceLimits
from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.errors import ShapeError
from tiletune.kernels.fused_attention.triton import SPEC as FORWARD
from tiletune.kernels.fused_attention_backward.triton import SPEC
from tiletune.kernels.triton.spec import triton_installed

pytestmark = pytest.mark.skipif(not triton_installed(), reason="triton is not installed (tiletune[triton])")

BLOCKS_16: Config = {"block_q": 16, "block_kv": 16, "num_stages": 1, "num_warps": 4}
H200 = DeviceLimits(local_memory_bytes=227 * 1024, max_buffer_num=8, alignment_bytes=16, kind="cuda")
#: (atol, rtol) against the float64 reference.
TOLERANCE = {torch.float32: (3e-5, 3e-4), torch.float16: (1.5e-2, 1.5e-2)}
Gradients = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


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


def make_qkvg(shape: Shape, dtype: torch.dtype = torch.float32, seed: int = 0) -> list[torch.Tensor]:
    """Standard normal ``q``, ``k``, ``v`` and ``grad_out``."""
    generator = torch.Generator().manual_seed(seed)
    b, d, h, sq = shape["batch"], shape["head_dim"], shape["heads"], shape["seq_q"]
    kv = (b, shape["kv_heads"], shape["seq_kv"], d)
    sizes = [(b, h, sq, d), kv, kv, (b, h, sq, d)]
    return [torch.randn(size, generator=generator).to(dtype) for size in sizes]


def explicit_attention(
    qkv: tuple[torch.Tensor, torch.Tensor, torch.Tensor], mask: torch.Tensor | None, causal: int, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Differentiable ``(out, lse)``; a row with no visible key: out 0, lse ``-inf``."""
    q, k, v = qkv
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-2, -1) * scale
    if mask is not None:
        scores = scores + mask
    seq_q, seq_kv = q.shape[2], k.shape[2]
    if causal:
        offset = 0 if causal == 1 else seq_kv - seq_q
        hidden = torch.arange(seq_kv)[None, :] > torch.arange(seq_q)[:, None] + offset
        scores = scores.masked_fill(hidden, -math.inf)
    empty = torch.isneginf(scores).all(-1, keepdim=True)
    safe = scores.masked_fill(empty, 0.0)
    out = (torch.softmax(safe, dim=-1) @ v).masked_fill(empty, 0.0)
    lse = torch.logsumexp(safe, dim=-1).masked_fill(empty[..., 0], -math.inf)
    return out, lse


def autograd_reference(
    inputs: list[torch.Tensor], causal: int, scale: float, grad_lse: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, Gradients]:
    """The forward's ``(out, lse)`` and ``(dq, dk, dv)`` by autograd, all float64."""
    q, k, v = (t.double().requires_grad_() for t in inputs[:3])
    grad = inputs[3].double()
    mask = inputs[4].double() if len(inputs) > 4 else None
    out, lse = explicit_attention((q, k, v), mask, causal, scale)
    loss = (out * grad).sum()
    if grad_lse is not None:
        loss = loss + (lse.masked_fill(torch.isneginf(lse), 0.0) * grad_lse.double()).sum()
    dq, dk, dv = torch.autograd.grad(loss, (q, k, v))
    return out.detach(), lse.detach(), (dq, dk, dv)


def backward_inputs(inputs: list[torch.Tensor], out: torch.Tensor, lse: torch.Tensor) -> list[torch.Tensor]:
    """``(q, k, v, out, lse, grad_out[, mask])`` in the kernel's order and dtypes."""
    q, k, v, grad = inputs[:4]
    return [q, k, v, out.to(q.dtype), lse.float(), grad, *inputs[4:]]


def expect_close(name: str, value: torch.Tensor, want: torch.Tensor, atol: float, rtol: float) -> None:
    """``value`` (widened to ``want``'s dtype) within tolerance of ``want``; a failure names it."""
    try:
        torch.testing.assert_close(value.to(want.dtype), want, atol=atol, rtol=rtol)
    except AssertionError as error:
        raise AssertionError(f"{name}: {error}") from None


def check(
    inputs: list[torch.Tensor],
    shape: Shape,
    config: Config = BLOCKS_16,
    *,
    scale: float | None = None,
    grad_lse: torch.Tensor | None = None,
) -> Gradients:
    """Run the kernel on the reference forward's ``(out, lse)``; compare with autograd; return it."""
    factor = shape["head_dim"] ** -0.5 if scale is None else scale
    out, lse, expected = autograd_reference(inputs, shape["causal"], factor, grad_lse)
    got = SPEC.gradients(backward_inputs(inputs, out, lse), config, shape, scale=scale, grad_lse=grad_lse)
    atol, rtol = TOLERANCE[inputs[0].dtype]
    for name, value, want, like in zip(("dq", "dk", "dv"), got, expected, inputs[:3], strict=True):
        assert value.shape == like.shape, name
        assert value.dtype == like.dtype, name
        assert not value.isnan().any(), name
        expect_close(name, value, want, atol, rtol)
    return got


@pytest.mark.parametrize("causal", [0, 1, 2])
@pytest.mark.parametrize(("seq_q", "seq_kv"), [(24, 24), (20, 45), (40, 18)])
def test_causal_alignments_match_autograd(causal: int, seq_q: int, seq_kv: int) -> None:
    shape = attention_shape(seq_q, seq_kv, causal=causal)
    check(make_qkvg(shape), shape)


def test_keys_no_query_sees_get_zero_gradients() -> None:
    shape = attention_shape(20, 45, causal=1)  # keys 20.. are after every query
    _, dk, dv = check(make_qkvg(shape), shape)
    assert torch.equal(dk[:, :, 20:], torch.zeros_like(dk[:, :, 20:]))
    assert torch.equal(dv[:, :, 20:], torch.zeros_like(dv[:, :, 20:]))
    assert dk[:, :, :20].abs().amin(-1).gt(0).all()


def test_rows_that_see_no_key_get_zero_dq() -> None:
    shape = attention_shape(40, 18, causal=2)  # query i sees keys j <= i - 22: none for i < 22
    dq, _, _ = check(
        make_qkvg(shape), shape, {"block_q": 32, "block_kv": 16, "num_stages": 1, "num_warps": 4}
    )
    assert torch.equal(dq[:, :, :22], torch.zeros_like(dq[:, :, :22]))
    # query 22 sees key 0 alone: P = 1 whatever its score, so its dq is 0 too
    assert dq[:, :, 23:].abs().amax(-1).gt(0).all()


GQA_SHAPE = attention_shape(37, 53, causal=2, heads=4, kv_heads=2, head_dim=24)
#: The valid block pairs of GQA_SHAPE on an H200, one and two stages (warps do not change the
#: interpreter's result; the stages do change the loops it runs).
SPACE = [
    config
    for config in SPEC.space(GQA_SHAPE, "float32", H200)
    if config["num_warps"] == 4 and config["num_stages"] <= 2
]


def test_the_space_holds_block_pairs_that_divide_neither_length() -> None:
    pairs = {(config["block_q"], config["block_kv"]) for config in SPACE}
    assert pairs == {(bq, bkv) for bq in (16, 32, 64) for bkv in (16, 32, 64)}
    assert {config["num_stages"] for config in SPACE} == {1, 2}


@pytest.mark.parametrize("config", SPACE, ids=lambda c: "q{block_q}-kv{block_kv}-s{num_stages}".format(**c))
def test_every_valid_block_and_stage_config_matches(config: Config) -> None:
    check(make_qkvg(GQA_SHAPE, seed=3), GQA_SHAPE, config)


@pytest.mark.parametrize("kv_heads", [2, 1])
@pytest.mark.parametrize("causal", [0, 1])
def test_grouped_query_heads_sum_into_their_kv_head(kv_heads: int, causal: int) -> None:
    shape = attention_shape(21, 37, causal=causal, heads=4, kv_heads=kv_heads, batch=2)
    check(make_qkvg(shape), shape, {"block_q": 16, "block_kv": 32, "num_stages": 2, "num_warps": 4})


@pytest.mark.parametrize("causal", [0, 1])
def test_a_broadcast_mask_with_fully_masked_rows(causal: int) -> None:
    shape = attention_shape(19, 35, causal=causal, heads=2, batch=2, mask=1)
    generator = torch.Generator().manual_seed(1)
    mask = torch.randn(1, 2, 19, 35, generator=generator)  # broadcast over the batch
    mask[:, :, :, 30:] = -math.inf  # keys past 30 hidden from every query
    mask[:, 1, 5] = -math.inf  # head 1's query 5 sees nothing
    mask[:, 0, 2, :20] = -math.inf  # head 0's query 2 sees no key of the first kv blocks
    dq, dk, dv = check([*make_qkvg(shape), mask], shape)
    assert torch.equal(dq[:, 1, 5], torch.zeros_like(dq[:, 1, 5]))
    assert torch.equal(dv[:, :, 30:], torch.zeros_like(dv[:, :, 30:]))
    assert torch.equal(dk[:, :, 30:], torch.zeros_like(dk[:, :, 30:]))


def test_masks_are_read_through_their_strides() -> None:
    shape = attention_shape(18, 33, causal=2, heads=4, kv_heads=2, batch=2, mask=1)
    generator = torch.Generator().manual_seed(2)
    per_batch = torch.randn(2, 1, 33, 18, generator=generator).transpose(-2, -1)  # not contiguous
    check([*make_qkvg(shape), per_batch], shape)
    per_position = torch.randn(18, 33, generator=generator).expand(1, 1, 18, 33)  # a view, strides 0
    check([*make_qkvg(shape, seed=1), per_position], shape)


def test_a_gradient_of_the_log_sum_exp_joins_the_rows_delta() -> None:
    shape = attention_shape(33, 19, causal=2, heads=4, kv_heads=1, mask=1)
    generator = torch.Generator().manual_seed(4)
    mask = torch.randn(1, 4, 33, 19, generator=generator)
    grad_lse = torch.randn(1, 4, 33, generator=generator)
    inputs = [*make_qkvg(shape), mask]
    with_lse = check(inputs, shape, grad_lse=grad_lse)
    without = check(inputs, shape)
    assert not torch.allclose(with_lse[0], without[0])
    assert torch.equal(with_lse[2], without[2])  # dv does not depend on it


def test_a_custom_scale_replaces_the_default() -> None:
    shape = attention_shape(30, 30, causal=1)
    inputs = make_qkvg(shape)
    dq, _, _ = check(inputs, shape, scale=0.3)
    default, _, _ = check(inputs, shape)
    assert not torch.allclose(dq, default)


@pytest.mark.parametrize(("causal", "mask"), [(2, 1), (0, 0)])
def test_float16_inputs_keep_their_dtype(causal: int, mask: int) -> None:
    shape = attention_shape(33, 47, causal=causal, heads=4, kv_heads=2, head_dim=40, mask=mask)
    inputs = make_qkvg(shape, torch.float16)
    if mask:
        bias = torch.zeros(1, 1, 33, 47, dtype=torch.float16)
        bias[..., ::3] = -1.5
        inputs.append(bias)
    check(inputs, shape, {"block_q": 32, "block_kv": 16, "num_stages": 2, "num_warps": 4})


def test_scaled_dot_product_attentions_gradients() -> None:
    shape = attention_shape(29, 29, causal=1, heads=4, kv_heads=2, head_dim=16, mask=1)
    q, k, v, grad = (t.double().requires_grad_(i < 3) for i, t in enumerate(make_qkvg(shape, seed=5)))
    mask = torch.randn(1, 4, 29, 29, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    # SDPA takes is_causal or a mask, not both: the causal part joins the mask.
    full = mask.masked_fill(torch.ones(29, 29, dtype=torch.bool).triu(1), -math.inf)
    out = scaled_dot_product_attention(q, k, v, attn_mask=full, enable_gqa=True)
    expected = torch.autograd.grad((out * grad).sum(), (q, k, v))
    _, lse = explicit_attention((q.detach(), k.detach(), v.detach()), mask, 1, 16**-0.5)
    inputs = [t.detach().float() for t in (q, k, v, out, lse, grad, mask)]
    got = SPEC.run(inputs, BLOCKS_16, shape)
    for name, value, want in zip(("dq", "dk", "dv"), got, expected, strict=True):
        expect_close(name, value, want, 3e-5, 3e-4)


def test_the_triton_forward_and_backward_chain() -> None:
    shape = attention_shape(45, 27, causal=2, heads=2, kv_heads=1, head_dim=24)
    q, k, v, grad = make_qkvg(shape, seed=7)
    config = {"block_q": 32, "block_kv": 16, "num_stages": 2, "num_warps": 4}
    out, lse = FORWARD.attend([q, k, v], config, shape)
    got = SPEC.run([q, k, v, out, lse, grad], config, shape)
    _, _, expected = autograd_reference([q, k, v, grad], 2, 24**-0.5, None)
    for name, value, want in zip(("dq", "dk", "dv"), got, expected, strict=True):
        expect_close(name, value, want, 3e-5, 3e-4)


def test_run_matches_the_portable_reference_on_its_inputs() -> None:
    shape = attention_shape(26, 38, causal=2, heads=2, kv_heads=1, head_dim=20, mask=1)
    inputs = SPEC.make_inputs(shape, "float32", torch.device("cpu"), seed=2)
    got = SPEC.run(inputs, {"block_q": 16, "block_kv": 32, "num_stages": 2, "num_warps": 2}, shape)
    for name, value, want in zip(("dq", "dk", "dv"), got, SPEC.reference(inputs, shape), strict=True):
        expect_close(name, value, want, 2e-5, 2e-4)


def test_bad_inputs_are_refused() -> None:
    shape = attention_shape(16, 16, mask=1)
    q, k, v, grad = make_qkvg(shape)
    out, lse = torch.zeros_like(q), torch.zeros(q.shape[:3])
    with pytest.raises(ValueError, match="takes 7 inputs"):
        SPEC.run([q, k, v, out, lse, grad], BLOCKS_16, shape)
    no_mask = {**shape, "mask": 0}
    with pytest.raises(ShapeError, match="grad_lse"):
        SPEC.gradients([q, k, v, out, lse, grad], BLOCKS_16, no_mask, grad_lse=torch.zeros(1, 2, 15))
    with pytest.raises(ValueError, match=r"mask of size \[1, 2, 16, 8\] does not broadcast"):
        SPEC.run([q, k, v, out, lse, grad, torch.zeros(1, 2, 16, 8)], BLOCKS_16, shape)
    odd = attention_shape(16, 16, heads=3, kv_heads=2)
    q3 = torch.zeros(1, 3, 16, 16)
    with pytest.raises(ValueError, match="3 query heads do not split into groups over 2 kv heads"):
        SPEC.run([q3, k, v, q3, torch.zeros(1, 3, 16), q3], BLOCKS_16, odd)
