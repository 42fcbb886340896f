"""The native C++ attention backward (``attention_backward``: dq, dk, dv from the forward's saved
log-sum-exp) against the PyTorch formula (``kernels/fused_attention_backward/formula.py``): both
causal alignments with square, short and long query sequences, grouped-query attention, a
broadcast mask with a fully masked row, a custom scale, blocks that divide no length and one or two
cores.

The forward's ``(out, lse)`` come from the native forward, so both backwards see the same saved
tensors. The extension is part of the product on CPUs: when it is not built these tests fail
with the reason, as ``test_native_attention.py``'s do.
"""

from __future__ import annotations

import pytest
import torch

from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.fused_attention.formula import AttentionSaved
from tiletune.kernels.fused_attention.native import SPEC
from tiletune.kernels.fused_attention_backward.formula import attention_backward
from tiletune.kernels.native.build import native_module, native_status

NO_CAUSAL, TOP_LEFT, BOTTOM_RIGHT = 0, 1, 2
#: (seq_q, seq_kv): square, fewer queries than keys, more queries than keys.
LENGTHS = ((67, 67), (37, 101), (101, 37))
#: Blocks that divide none of LENGTHS.
CONFIG: Config = {"block_q": 16, "block_kv": 32, "block_dim": 2, "buffer_num": 2, "pipeline_depth": 2}
#: (atol, rtol) of dq, dk and dv per dtype.
TOLERANCE = {torch.float32: (2e-5, 2e-4), torch.bfloat16: (3e-2, 3e-2)}


@pytest.fixture(autouse=True)
def native_built() -> None:
    """Fail (not skip) with the reason when the extension is not built here."""
    status = native_status()
    if not status.available:
        pytest.fail(f"the native CPU backend is unavailable: {status.reason}")
    if not hasattr(native_module(), "attention_backward"):
        pytest.fail("the native extension has no attention_backward (is it bound and built?)")


def make_inputs(
    sizes: tuple[int, int, int, int, int, int], dtype: torch.dtype, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Standard normal q, k, v and the output's gradient of ``sizes`` (batch, heads, kv_heads,
    seq_q, seq_kv, head_dim)."""
    batch, heads, kv_heads, seq_q, seq_kv, d = sizes
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn((batch, heads, seq_q, d), generator=generator)
    k, v = (torch.randn((batch, kv_heads, seq_kv, d), generator=generator) for _ in range(2))
    grad = torch.randn((batch, heads, seq_q, d), generator=generator)
    return q.to(dtype), k.to(dtype), v.to(dtype), grad.to(dtype)


def shape_of(q: torch.Tensor, k: torch.Tensor, causal: int, mask: bool) -> Shape:
    batch, heads, seq_q, head_dim = q.shape
    return {
        "batch": batch,
        "heads": heads,
        "kv_heads": k.shape[1],
        "seq_q": seq_q,
        "seq_kv": k.shape[2],
        "head_dim": head_dim,
        "causal": causal,
        "mask": int(mask),
    }


def native_backward(
    saved: AttentionSaved, grad: torch.Tensor, config: Config, grad_lse: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The extension's ``attention_backward`` on what the forward saved."""
    scale = saved.q.shape[-1] ** -0.5 if saved.scale is None else saved.scale
    result: tuple[torch.Tensor, torch.Tensor, torch.Tensor] = native_module().attention_backward(
        saved.q,
        saved.k,
        saved.v,
        saved.mask,
        saved.out,
        saved.lse,
        grad,
        grad_lse,
        saved.causal,
        scale,
        config["block_q"],
        config["block_kv"],
        config["block_dim"],
        config["buffer_num"],
        config["pipeline_depth"],
    )
    return result


def forward(
    inputs: tuple[torch.Tensor, ...], causal: int, config: Config, scale: float | None
) -> AttentionSaved:
    """The native forward's ``(out, lse)`` of ``(q, k, v[, mask])``, saved for a backward."""
    q, k, v = inputs[:3]
    mask = inputs[3] if len(inputs) == 4 else None
    out, lse = SPEC.attend(inputs, config, shape_of(q, k, causal, mask is not None), scale=scale)
    return AttentionSaved(q, k, v, mask, out, lse, causal, scale)


def check(
    inputs: tuple[torch.Tensor, ...],
    grad: torch.Tensor,
    causal: int,
    config: Config = CONFIG,
    scale: float | None = None,
    *,
    grad_lse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run both backwards on the native forward's saved tensors and compare dq, dk and dv;
    returns the native ones."""
    saved = forward(inputs, causal, config, scale)
    got = native_backward(saved, grad, config, grad_lse)
    want = attention_backward(saved, grad, grad_lse, mask_grad=False)[:3]
    atol, rtol = TOLERANCE[saved.q.dtype]
    for name, value, expected, like in zip(
        ("dq", "dk", "dv"), got, want, (saved.q, saved.k, saved.v), strict=True
    ):
        assert value.dtype == like.dtype, name
        assert value.shape == like.shape, name
        assert value.isfinite().all(), name
        torch.testing.assert_close(value.float(), expected.float(), atol=atol, rtol=rtol, msg=name)
    return got


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("causal", [NO_CAUSAL, TOP_LEFT, BOTTOM_RIGHT])
@pytest.mark.parametrize(("seq_q", "seq_kv"), LENGTHS)
def test_causal_alignments_and_lengths_match_the_torch_backward(
    dtype: torch.dtype, causal: int, seq_q: int, seq_kv: int
) -> None:
    *inputs, grad = make_inputs((2, 4, 2, seq_q, seq_kv, 24), dtype)
    dq, dk, _ = check(tuple(inputs), grad, causal)
    if causal == BOTTOM_RIGHT and seq_q > seq_kv:  # the first seq_q - seq_kv queries see no key
        assert (dq[:, :, : seq_q - seq_kv] == 0).all()
    if causal == TOP_LEFT and seq_kv > seq_q:  # no query sees the keys past seq_q
        assert (dk[:, :, seq_q:] == 0).all()


@pytest.mark.parametrize("kv_heads", [2, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_grouped_query_heads_sum_their_group(kv_heads: int, dtype: torch.dtype) -> None:
    *inputs, grad = make_inputs((1, 4, kv_heads, 45, 53, 16), dtype, seed=3)
    check(tuple(inputs), grad, TOP_LEFT)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_broadcast_mask_with_a_fully_masked_row(dtype: torch.dtype) -> None:
    *inputs, grad = make_inputs((2, 4, 2, 29, 41, 16), dtype, seed=5)
    generator = torch.Generator().manual_seed(6)
    bias = 0.5 * torch.randn((2, 1, 29, 41), generator=generator)  # broadcast over heads
    bias = bias.masked_fill(torch.rand((2, 1, 29, 41), generator=generator) < 0.3, float("-inf"))
    bias[0, 0, 7] = float("-inf")  # query 7 of batch 0 sees no key in any head
    dq, _, _ = check((*inputs, bias.to(dtype)), grad, NO_CAUSAL)
    assert (dq[0, :, 7] == 0).all()


def test_custom_scale_and_one_core() -> None:
    *inputs, grad = make_inputs((1, 2, 1, 50, 70, 32), torch.float32, seed=7)
    config = {**CONFIG, "block_q": 7, "block_kv": 13, "block_dim": 1}
    check(tuple(inputs), grad, BOTTOM_RIGHT, config, scale=0.3)


@pytest.mark.parametrize("block_dim", [1, 2])
@pytest.mark.parametrize(("block_q", "block_kv"), [(1, 1), (64, 5), (128, 128)])
def test_blocks_and_cores_agree(block_q: int, block_kv: int, block_dim: int) -> None:
    *inputs, grad = make_inputs((1, 2, 2, 33, 47, 8), torch.float32, seed=9)
    config = {**CONFIG, "block_q": block_q, "block_kv": block_kv, "block_dim": block_dim}
    check(tuple(inputs), grad, TOP_LEFT, config)


def test_inconsistent_tensors_are_rejected() -> None:
    q, k, v, grad = make_inputs((1, 2, 1, 8, 8, 4), torch.float32)
    saved = forward((q, k, v), NO_CAUSAL, CONFIG, None)
    backward = native_module().attention_backward
    with pytest.raises(RuntimeError, match="lse must be float32"):
        backward(q, k, v, None, saved.out, saved.lse.double(), grad, None, 0, 0.5, 4, 4, 1, 2, 2)
    with pytest.raises(RuntimeError, match="grad_out must have q's size"):
        backward(
            q, k, v, None, saved.out, saved.lse, grad[:, :, :4].contiguous(), None, 0, 0.5, 4, 4, 1, 2, 2
        )
    with pytest.raises(RuntimeError, match="causal must be 0"):
        backward(q, k, v, None, saved.out, saved.lse, grad, None, 3, 0.5, 4, 4, 1, 2, 2)
    with pytest.raises(RuntimeError, match="blocks must be >= 1"):
        backward(q, k, v, None, saved.out, saved.lse, grad, None, 0, 0.5, 0, 4, 1, 2, 2)


@pytest.mark.parametrize("causal", [NO_CAUSAL, BOTTOM_RIGHT])
def test_a_gradient_of_the_log_sum_exp_joins_the_output_s(causal: int) -> None:
    """``dS = P (dP - D + g_lse)``: the log-sum-exp's own gradient, as the PyTorch backward takes it."""
    *inputs, grad = make_inputs((2, 4, 2, 33, 47, 16), torch.float32)
    grad_lse = torch.randn(2, 4, 33, generator=torch.Generator().manual_seed(9))
    check(tuple(inputs), grad, causal, grad_lse=grad_lse)
