"""The native C++ attention forward against an explicit float64 formula written here: grouped-query
attention, both causal alignments, broadcast additive masks (strided too), a custom scale, the
log-sum-exp, rows that see no key, and every pipeline knob.

The extension is part of the product on CPUs: when it is not built these tests fail with the
reason (``make setup`` builds it), as ``test_native.py``'s do.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.fused_attention.native import SPEC
from tiletune.kernels.native.build import native_status

NO_CAUSAL, TOP_LEFT, BOTTOM_RIGHT = 0, 1, 2
#: (seq_q, seq_kv): square, fewer queries than keys (decode / chunked prefill), more queries.
LENGTHS = ((67, 67), (37, 101), (101, 37))
#: Blocks that divide none of LENGTHS.
CONFIG: Config = {"block_q": 16, "block_kv": 32, "block_dim": 2, "buffer_num": 2, "pipeline_depth": 2}
#: (atol, rtol) of the output per dtype; the float32 log-sum-exp is held to LSE_TOLERANCE.
TOLERANCE = {torch.float32: (2e-5, 1e-4), torch.bfloat16: (1.5e-2, 1.5e-2)}
LSE_TOLERANCE = {torch.float32: (2e-5, 1e-5), torch.bfloat16: (1e-4, 1e-5)}


@pytest.fixture(autouse=True)
def native_built() -> None:
    """Fail (not skip) with the reason when the extension is not built here."""
    status = native_status()
    if not status.available:
        pytest.fail(f"the native CPU backend is unavailable: {status.reason}")


def reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: torch.Tensor | None,
    causal: int,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, lse)`` in float64: scores = q k^T * scale + mask, causal -inf, GQA by indexing the kv
    heads; a row without a visible key gets out 0 and lse -inf."""
    heads, kv_heads = q.shape[1], k.shape[1]
    kv_of_head = torch.arange(heads) // (heads // kv_heads)
    k64, v64 = k.double()[:, kv_of_head], v.double()[:, kv_of_head]
    scores = q.double() @ k64.transpose(-1, -2) * scale
    if mask is not None:
        scores = scores + mask.double()
    if causal != NO_CAUSAL:
        seq_q, seq_kv = q.shape[2], k.shape[2]
        diagonal = 0 if causal == TOP_LEFT else seq_kv - seq_q
        hidden = torch.arange(seq_kv)[None, :] > torch.arange(seq_q)[:, None] + diagonal
        scores = scores.masked_fill(hidden, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probabilities = torch.exp(scores - lse[..., None]).nan_to_num(nan=0.0)
    return probabilities @ v64, lse


def make_qkv(
    sizes: tuple[int, int, int, int, int, int], dtype: torch.dtype, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Standard normal q, k, v of ``sizes`` (batch, heads, kv_heads, seq_q, seq_kv, head_dim)."""
    batch, heads, kv_heads, seq_q, seq_kv, d = sizes
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn((batch, heads, seq_q, d), generator=generator)
    k, v = (torch.randn((batch, kv_heads, seq_kv, d), generator=generator) for _ in range(2))
    return q.to(dtype), k.to(dtype), v.to(dtype)


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


def keep_mask(sizes: tuple[int, ...], dtype: torch.dtype, seed: int = 1) -> torch.Tensor:
    """An additive mask from a boolean one (about 30% of the keys hidden, -inf), with a bias."""
    generator = torch.Generator().manual_seed(seed)
    keep = torch.rand(sizes, generator=generator) > 0.3
    bias = 0.5 * torch.randn(sizes, generator=generator)
    return bias.masked_fill(~keep, float("-inf")).to(dtype)


def check(
    inputs: tuple[torch.Tensor, ...],
    causal: int,
    config: Config = CONFIG,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the kernel, compare out and lse with :func:`reference`; returns the kernel's (out, lse)."""
    q, k, v = inputs[:3]
    mask = inputs[3] if len(inputs) == 4 else None
    shape = shape_of(q, k, causal, mask is not None)
    out, lse = SPEC.attend(inputs, config, shape, scale=scale)
    want_out, want_lse = reference(
        q, k, v, mask=mask, causal=causal, scale=q.shape[3] ** -0.5 if scale is None else scale
    )
    assert out.dtype == q.dtype
    assert out.shape == q.shape
    assert lse.dtype == torch.float32
    assert lse.shape == q.shape[:3]
    assert not out.isnan().any()
    assert not lse.isnan().any()
    atol, rtol = TOLERANCE[q.dtype]
    torch.testing.assert_close(out.double(), want_out, atol=atol, rtol=rtol)
    atol, rtol = LSE_TOLERANCE[q.dtype]
    torch.testing.assert_close(lse.double(), want_lse, atol=atol, rtol=rtol)
    return out, lse


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("causal", [NO_CAUSAL, TOP_LEFT, BOTTOM_RIGHT])
@pytest.mark.parametrize(("seq_q", "seq_kv"), LENGTHS)
def test_causal_alignments_and_lengths_match_the_formula(
    dtype: torch.dtype, causal: int, seq_q: int, seq_kv: int
) -> None:
    out, lse = check(make_qkv((2, 4, 2, seq_q, seq_kv, 24), dtype), causal)
    if causal == BOTTOM_RIGHT and seq_q > seq_kv:  # the first seq_q - seq_kv queries see no key
        blind = seq_q - seq_kv
        assert (out[:, :, :blind] == 0).all()
        assert (lse[:, :, :blind] == float("-inf")).all()
        assert lse[:, :, blind:].isfinite().all()
    else:
        assert lse.isfinite().all()


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
@pytest.mark.parametrize("causal", [NO_CAUSAL, BOTTOM_RIGHT])
def test_grouped_query_heads_read_their_kv_head(kv_heads: int, causal: int) -> None:
    q, k, v = make_qkv((2, 4, kv_heads, 40, 56, 16), torch.float32, seed=kv_heads)
    out, _ = check((q, k, v), causal)
    # the same as attention over k and v repeated per query head (the memory GQA saves)
    group = 4 // kv_heads
    repeated = (q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1))
    same, _ = SPEC.attend(repeated, CONFIG, shape_of(q, repeated[1], causal, False))
    torch.testing.assert_close(out, same, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("broadcast", ["none", "batch", "heads", "both"])
@pytest.mark.parametrize("causal", [NO_CAUSAL, TOP_LEFT, BOTTOM_RIGHT])
def test_broadcast_masks_join_the_scores_and_a_hidden_row_gives_zero(
    dtype: torch.dtype, broadcast: str, causal: int
) -> None:
    batch, heads, seq_q, seq_kv = 2, 4, 45, 70
    q, k, v = make_qkv((batch, heads, 2, seq_q, seq_kv, 16), dtype)
    sizes = {"none": (batch, heads), "batch": (1, heads), "heads": (batch, 1), "both": (1, 1)}[broadcast]
    mask = keep_mask((*sizes, seq_q, seq_kv), dtype)
    mask[..., 5, :] = float("-inf")  # query 5 sees no key, in every (batch, head)
    mask[..., 30, 33:] = float("-inf")  # query 30 sees keys in the first blocks only
    mask[..., 12, :40] = float("-inf")  # query 12's first kv block is all hidden, a later one is not
    out, lse = check((q, k, v, mask), causal)
    assert (out[:, :, 5] == 0).all()
    assert (lse[:, :, 5] == float("-inf")).all()


def test_strided_masks_are_read_through_their_strides() -> None:
    """A mask expanded over batch and heads (stride 0 with size > 1) and one whose last dim is not
    contiguous give what their contiguous copies give."""
    q, k, v = make_qkv((2, 4, 4, 33, 50, 16), torch.float32)
    expanded = keep_mask((2, 1, 33, 50), torch.float32).expand(2, 4, 33, 50)
    transposed = keep_mask((1, 4, 50, 33), torch.float32, seed=3).transpose(2, 3)
    assert expanded.stride(1) == 0
    assert transposed.stride(3) != 1
    for mask in (expanded, transposed):
        for causal in (NO_CAUSAL, TOP_LEFT):
            out, lse = check((q, k, v, mask), causal)
            shape = shape_of(q, k, causal, True)
            copy_out, copy_lse = SPEC.attend((q, k, v, mask.contiguous()), CONFIG, shape)
            assert torch.equal(out, copy_out)
            assert torch.equal(lse, copy_lse)


@pytest.mark.parametrize("scale", [0.05, 0.3, 1.7])
def test_a_custom_scale_multiplies_the_scores(scale: float) -> None:
    inputs = make_qkv((1, 2, 1, 50, 50, 32), torch.float32)
    out, _ = check(inputs, TOP_LEFT, scale=scale)
    default, _ = SPEC.attend(inputs, CONFIG, shape_of(inputs[0], inputs[1], TOP_LEFT, False))
    assert not torch.allclose(out, default)


def test_every_block_size_core_count_buffer_and_depth_gives_the_formula() -> None:
    q, k, v = make_qkv((1, 4, 2, 53, 77, 8), torch.float32)
    mask = keep_mask((1, 1, 53, 77), torch.float32)
    blocks = ((16, 16), (16, 64), (32, 16), (64, 128), (1024, 1024))
    for (block_q, block_kv), block_dim, buffers, depth in itertools.product(
        blocks, (1, 2), (1, 2, 3), (1, 2, 3)
    ):
        config = {
            "block_q": block_q,
            "block_kv": block_kv,
            "block_dim": block_dim,
            "buffer_num": buffers,
            "pipeline_depth": depth,
        }
        for causal in (NO_CAUSAL, BOTTOM_RIGHT):
            check((q, k, v, mask), causal, config)


def test_whole_tiles_that_see_no_key_give_zero_and_minus_infinity() -> None:
    """Bottom-right with far more queries than keys: whole q blocks have no kv step at all."""
    q, k, v = make_qkv((1, 2, 1, 100, 10, 16), torch.bfloat16)
    for block_dim in (1, 2):
        out, lse = check((q, k, v), BOTTOM_RIGHT, {**CONFIG, "block_dim": block_dim})
        assert (out[:, :, :90] == 0).all()
        assert (lse[:, :, :90] == float("-inf")).all()


def test_float16_and_float64_are_served_too() -> None:
    for dtype, atol in ((torch.float16, 2e-3), (torch.float64, 2e-5)):
        q, k, v = make_qkv((1, 2, 2, 30, 40, 16), dtype)
        mask = keep_mask((1, 2, 30, 40), dtype)
        out, lse = SPEC.attend((q, k, v, mask), CONFIG, shape_of(q, k, TOP_LEFT, True))
        want_out, want_lse = reference(q, k, v, mask=mask, causal=TOP_LEFT, scale=0.25)
        assert out.dtype == dtype
        assert lse.dtype == torch.float32
        torch.testing.assert_close(out.double(), want_out, atol=atol, rtol=atol)
        torch.testing.assert_close(lse.double(), want_lse, atol=1e-4, rtol=1e-5)


def test_run_gives_attends_output_and_a_portable_config_gets_the_default_cores() -> None:
    q, k, v = make_qkv((2, 4, 2, 40, 40, 16), torch.float32)
    mask = keep_mask((2, 1, 40, 40), torch.float32).expand(2, 4, 40, 40)  # stride 0 over heads
    shape = shape_of(q, k, TOP_LEFT, True)
    portable = {key: value for key, value in CONFIG.items() if key != "block_dim"}
    out, _ = check((q, k, v, mask), TOP_LEFT, portable)
    assert torch.equal(SPEC.run((q, k, v, mask), CONFIG, shape), out)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("kv_heads", "must be a multiple of kv_heads"),
        ("mask_dtype", "mask must have q's dtype"),
        ("mask_shape", "does not broadcast"),
        ("mask_ndim", "mask must be 4-D"),
        ("causal", "causal must be 0"),
        ("head_dim", "differ in head_dim"),
        ("q_ndim", "q must be 4-D"),
    ],
)
def test_inconsistent_inputs_are_refused_with_a_reason(change: str, message: str) -> None:
    q, k, v = make_qkv((1, 4, 2, 8, 8, 16), torch.float32)
    mask: torch.Tensor = torch.zeros(1, 1, 8, 8)
    causal = NO_CAUSAL
    if change == "kv_heads":
        k, v = k[:, :1].expand(1, 3, 8, 16).contiguous(), v[:, :1].expand(1, 3, 8, 16).contiguous()
    elif change == "mask_dtype":
        mask = mask.double()
    elif change == "mask_shape":
        mask = torch.zeros(1, 1, 8, 7)
    elif change == "mask_ndim":
        mask = torch.zeros(8, 8)
    elif change == "causal":
        causal = 3
    elif change == "head_dim":
        k, v = k[..., :8].contiguous(), v[..., :8].contiguous()
    else:
        q = q[0]
    shape = {"batch": 1, "heads": 4, "kv_heads": 2, "seq_q": 8, "seq_kv": 8, "head_dim": 16}
    with pytest.raises(RuntimeError, match=message):
        SPEC.attend((q, k, v, mask), CONFIG, {**shape, "causal": causal, "mask": 1})


def test_a_declared_mask_must_be_given() -> None:
    q, k, v = make_qkv((1, 2, 2, 8, 8, 16), torch.float32)
    with pytest.raises(ValueError, match="declares a mask"):
        SPEC.attend((q, k, v), CONFIG, shape_of(q, k, NO_CAUSAL, True))
