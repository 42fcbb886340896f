# Triton's conventions: compile-time constants (tl.constexpr) are UPPER_CASE, kernels take many
# positional arguments.
# ruff: noqa: N803, PLR0917
"""The ``@triton.jit`` kernels of ``triton_fused_attention_backward``: FlashAttention-2's backward.

Imported only on the kernel's first run (:func:`tiletune.kernels.triton.spec.triton_kernels`, module
``attention_backward_jit``), so triton is needed only where it runs; ``TRITON_INTERPRET=1`` must be
set before that import for CPU tensors (``INTERPRETED`` records whether it was).

Three launches, all from the forward's saved float32 log-sum-exp (``lse``, natural log; ``-inf`` on a
row that sees no key, whose probabilities are then 0):

1. preprocess: ``D = rowsum(dO * O) - grad_lse`` (float32 ``[batch, heads, seq_q]``);
2. dk/dv: a program per (kv block, batch x kv head); it loops the query heads of its group and the q
   blocks that see its keys (causal: from the first that does), recomputes ``P^T = exp(K Q^T * scale
   + mask^T - lse)`` and accumulates ``dv += P^T dO``, ``dk += dS^T Q`` with ``dS = P (dO V^T - D)``
   in float32; ``dk`` is scaled once at the end;
3. dq: a program per (q block, batch x head), over the kv blocks its queries see: ``dq += dS K``.

Scores are in base 2 as in the forward (``exp2``; the mask is added times ``log2(e)``, ``lse`` is
taken times ``log2(e)``). Each loop is split in two like the forward's: blocks that need no mask
run without one, the rest (the causal diagonal, every block with an additive mask, and dq's last
kv block past ``seq_kv``) with it. Padded query rows read ``lse = +inf`` (``P = 0``), so the dk/dv
pass never masks ``seq_q``'s overhang; ``head_dim`` is padded to a power of two >= 16 with masked
loads. ``num_stages`` pipelines the inner loops (launch option).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import triton
import triton.language as tl

from tiletune.kernels.fused_attention.declaration import padded_head_dim
from tiletune.kernels.triton.jit import LOG2_E, dot_precision, mask_strides
from tiletune.kernels.triton.spec import interpreting

#: Whether ``@triton.jit`` below made interpreted kernels (it reads TRITON_INTERPRET when decorating).
INTERPRETED: bool = interpreting()
_LOG2_E: tl.constexpr = tl.constexpr(LOG2_E)


@triton.jit  # type: ignore[untyped-decorator]
def _preprocess_kernel(  # type: ignore[no-untyped-def]
    out_ptr, grad_ptr, grad_lse_ptr, delta_ptr, seq_q,
    HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr, BLOCK_Q: tl.constexpr, HAS_GRAD_LSE: tl.constexpr,
):  # fmt: skip
    """``delta = rowsum(grad * out) [- grad_lse]`` for one q block of one (batch, head)."""
    bh = tl.program_id(1).to(tl.int64)
    rq = tl.program_id(0) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    rd = tl.arange(0, HEAD_PAD)
    mask = (rq[:, None] < seq_q) & (rd[None, :] < HEAD_DIM)
    offsets = bh * seq_q * HEAD_DIM + rq.to(tl.int64)[:, None] * HEAD_DIM + rd[None, :]
    o = tl.load(out_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    do = tl.load(grad_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    delta = tl.sum(o * do, axis=1)
    if HAS_GRAD_LSE:
        delta -= tl.load(grad_lse_ptr + bh * seq_q + rq, mask=rq < seq_q, other=0.0)
    tl.store(delta_ptr + bh * seq_q + rq, delta, mask=rq < seq_q)


@triton.jit
def _row_stats(lse_ptr, delta_ptr, rq, seq_q):  # type: ignore[no-untyped-def]
    """``(lse * log2(e), delta)`` of rows ``rq``: ``+inf`` (so ``P = 0``) for a row that sees no key
    (``lse = -inf``) or lies past ``seq_q``."""
    lse = tl.load(lse_ptr + rq, mask=rq < seq_q, other=float("inf"))
    lse = tl.where(lse == -float("inf"), float("inf"), lse) * _LOG2_E
    return lse, tl.load(delta_ptr + rq, mask=rq < seq_q, other=0.0)


@triton.jit  # type: ignore[untyped-decorator]
def _dkdv_blocks(  # type: ignore[no-untyped-def]
    dk, dv, k, v, q_ptr, grad_ptr, lse_ptr, delta_ptr, mask_ptr, rkv, d_mask, lo, hi, seq_q, seq_kv,
    diagonal, qk_scale, mask_stride_q, mask_stride_kv,
    HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr, BLOCK_Q: tl.constexpr, MASKED: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """Fold q blocks ``lo..hi`` of one query head into the kv block's ``dk`` (unscaled) and ``dv``.

    Works on transposed blocks (``[BLOCK_KV, BLOCK_Q]``): ``P^T``, ``dP^T``, ``dS^T``. Masked: keys
    ``j > i + diagonal`` hidden (``CAUSAL``), the additive mask added (``HAS_MASK``).
    """
    rd = tl.arange(0, HEAD_PAD)
    for start in tl.range(lo, hi, BLOCK_Q):
        rq = start + tl.arange(0, BLOCK_Q)
        load_mask = (rq[:, None] < seq_q) & d_mask[None, :]
        offsets = rq.to(tl.int64)[:, None] * HEAD_DIM + rd[None, :]
        q = tl.load(q_ptr + offsets, mask=load_mask, other=0.0)
        do = tl.load(grad_ptr + offsets, mask=load_mask, other=0.0)
        lse, delta = _row_stats(lse_ptr, delta_ptr, rq, seq_q)
        scores = tl.dot(k, tl.trans(q), input_precision=PRECISION) * qk_scale
        if MASKED:
            if HAS_MASK:
                bias_offsets = (
                    rkv.to(tl.int64)[:, None] * mask_stride_kv + rq.to(tl.int64)[None, :] * mask_stride_q
                )
                bias_mask = (rkv[:, None] < seq_kv) & (rq[None, :] < seq_q)
                bias = tl.load(mask_ptr + bias_offsets, mask=bias_mask, other=0.0)
                scores += bias.to(tl.float32) * _LOG2_E
            if CAUSAL:
                scores = tl.where(rkv[:, None] <= rq[None, :] + diagonal, scores, -float("inf"))
        p = tl.exp2(scores - lse[None, :])
        dv = tl.dot(p.to(do.dtype), do, dv, input_precision=PRECISION)
        dp = tl.dot(v, tl.trans(do), input_precision=PRECISION)
        ds = p * (dp - delta[None, :])
        dk = tl.dot(ds.to(q.dtype), q, dk, input_precision=PRECISION)
    return dk, dv


@triton.jit  # type: ignore[untyped-decorator]
def _dkdv_range(  # type: ignore[no-untyped-def]
    kv_start, seq_q, seq_kv, diagonal,
    BLOCK_Q: tl.constexpr, BLOCK_KV: tl.constexpr, CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr,
):  # fmt: skip
    """``(lo, mid)`` for the kv block at ``kv_start``: q blocks before ``lo`` see none of its keys,
    ``lo..mid`` need a mask, those from ``mid`` to ``seq_q`` none (query ``i`` sees key ``j`` when
    ``j <= i + diagonal``). With ``HAS_MASK`` every q block from ``lo`` is masked (``mid = seq_q``)."""
    lo = 0
    mid = 0
    if CAUSAL:
        lo = tl.minimum((tl.maximum(kv_start - diagonal, 0) // BLOCK_Q) * BLOCK_Q, seq_q)
        # Queries from kv_last - diagonal on see every key of the block.
        kv_last = tl.minimum(kv_start + BLOCK_KV, seq_kv) - 1
        mid = tl.minimum(tl.cdiv(tl.maximum(kv_last - diagonal, 0), BLOCK_Q) * BLOCK_Q, seq_q)
        mid = tl.maximum(mid, lo)
    if HAS_MASK:
        mid = seq_q
    return lo, mid


@triton.jit  # type: ignore[untyped-decorator]
def _dkdv_kernel(  # type: ignore[no-untyped-def]
    q_ptr, k_ptr, v_ptr, grad_ptr, lse_ptr, delta_ptr, mask_ptr, dk_ptr, dv_ptr, heads, kv_heads, group,
    seq_q, seq_kv, diagonal, scale, qk_scale, mask_stride_b, mask_stride_h, mask_stride_q, mask_stride_kv,
    HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_KV: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    kv_start = tl.program_id(0) * BLOCK_KV
    kv_bh = tl.program_id(1).to(tl.int64)
    batch, kv_head = kv_bh // kv_heads, kv_bh % kv_heads
    rkv = kv_start + tl.arange(0, BLOCK_KV)
    rd = tl.arange(0, HEAD_PAD)
    d_mask = rd < HEAD_DIM
    kv_mask = (rkv[:, None] < seq_kv) & d_mask[None, :]
    kv_offsets = kv_bh * seq_kv * HEAD_DIM + rkv.to(tl.int64)[:, None] * HEAD_DIM + rd[None, :]
    k = tl.load(k_ptr + kv_offsets, mask=kv_mask, other=0.0)
    v = tl.load(v_ptr + kv_offsets, mask=kv_mask, other=0.0)
    dk = tl.zeros([BLOCK_KV, HEAD_PAD], tl.float32)
    dv = tl.zeros([BLOCK_KV, HEAD_PAD], tl.float32)
    lo, mid = _dkdv_range(kv_start, seq_q, seq_kv, diagonal, BLOCK_Q, BLOCK_KV, CAUSAL, HAS_MASK)
    for member in range(0, group):  # the query heads that read this kv head
        head = kv_head * group + member
        bh = batch * heads + head
        q_head = q_ptr + bh * seq_q * HEAD_DIM
        grad_head = grad_ptr + bh * seq_q * HEAD_DIM
        lse_head = lse_ptr + bh * seq_q
        delta_head = delta_ptr + bh * seq_q
        mask_head = mask_ptr + batch * mask_stride_b + head * mask_stride_h
        dk, dv = _dkdv_blocks(
            dk, dv, k, v, q_head, grad_head, lse_head, delta_head, mask_head, rkv, d_mask, lo, mid, seq_q,
            seq_kv, diagonal, qk_scale, mask_stride_q, mask_stride_kv, HEAD_DIM, HEAD_PAD, BLOCK_Q, True,
            CAUSAL, HAS_MASK, PRECISION,
        )  # fmt: skip
        dk, dv = _dkdv_blocks(
            dk, dv, k, v, q_head, grad_head, lse_head, delta_head, mask_head, rkv, d_mask, mid, seq_q,
            seq_q, seq_kv, diagonal, qk_scale, mask_stride_q, mask_stride_kv, HEAD_DIM, HEAD_PAD, BLOCK_Q,
            False, CAUSAL, HAS_MASK, PRECISION,
        )  # fmt: skip
    tl.store(dk_ptr + kv_offsets, (dk * scale).to(dk_ptr.dtype.element_ty), mask=kv_mask)
    tl.store(dv_ptr + kv_offsets, dv.to(dv_ptr.dtype.element_ty), mask=kv_mask)


@triton.jit  # type: ignore[untyped-decorator]
def _dq_blocks(  # type: ignore[no-untyped-def]
    dq, q, do, lse, delta, k_ptr, v_ptr, mask_ptr, rq, d_mask, lo, hi, seq_q, seq_kv, diagonal,
    qk_scale, mask_stride_q, mask_stride_kv,
    HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr, BLOCK_KV: tl.constexpr, MASKED: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """Fold kv blocks ``lo..hi`` into the q block's ``dq`` (unscaled). Masked: keys past ``seq_kv``
    and (``CAUSAL``) keys ``j > i + diagonal`` hidden, the additive mask added (``HAS_MASK``)."""
    rd = tl.arange(0, HEAD_PAD)
    for start in tl.range(lo, hi, BLOCK_KV):
        rkv = start + tl.arange(0, BLOCK_KV)
        kv_mask = rkv < seq_kv
        offsets = rkv.to(tl.int64)[:, None] * HEAD_DIM + rd[None, :]
        k = tl.load(k_ptr + offsets, mask=kv_mask[:, None] & d_mask[None, :], other=0.0)
        v = tl.load(v_ptr + offsets, mask=kv_mask[:, None] & d_mask[None, :], other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        if MASKED:
            if HAS_MASK:
                bias_offsets = (
                    rq.to(tl.int64)[:, None] * mask_stride_q + rkv.to(tl.int64)[None, :] * mask_stride_kv
                )
                bias_mask = (rq[:, None] < seq_q) & kv_mask[None, :]
                bias = tl.load(mask_ptr + bias_offsets, mask=bias_mask, other=0.0)
                scores += bias.to(tl.float32) * _LOG2_E
            keep = kv_mask[None, :]
            if CAUSAL:
                keep = keep & (rkv[None, :] <= rq[:, None] + diagonal)
            scores = tl.where(keep, scores, -float("inf"))
        p = tl.exp2(scores - lse[:, None])
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=PRECISION)
    return dq


@triton.jit  # type: ignore[untyped-decorator]
def _dq_range(  # type: ignore[no-untyped-def]
    q_start, seq_q, seq_kv, diagonal,
    BLOCK_Q: tl.constexpr, BLOCK_KV: tl.constexpr, CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr,
):  # fmt: skip
    """``(lo, hi)`` for the q block at ``q_start``: kv blocks before ``lo`` need no mask, ``lo..hi``
    do, keys from ``hi`` on are seen by none of its queries. With ``HAS_MASK`` all are masked."""
    full = (seq_kv // BLOCK_KV) * BLOCK_KV
    if CAUSAL:
        seen_by_all = tl.maximum(q_start + diagonal + 1, 0)
        lo = tl.minimum((seen_by_all // BLOCK_KV) * BLOCK_KV, full)
        hi = tl.minimum(tl.maximum(tl.minimum(q_start + BLOCK_Q, seq_q) + diagonal, 0), seq_kv)
        lo = tl.minimum(lo, tl.maximum(hi, 0))
    else:
        lo = full
        hi = seq_kv
    if HAS_MASK:
        lo = 0
    return lo, hi


@triton.jit  # type: ignore[untyped-decorator]
def _dq_kernel(  # type: ignore[no-untyped-def]
    q_ptr, k_ptr, v_ptr, grad_ptr, lse_ptr, delta_ptr, mask_ptr, dq_ptr, heads, kv_heads, group, seq_q,
    seq_kv, diagonal, scale, qk_scale, mask_stride_b, mask_stride_h, mask_stride_q, mask_stride_kv,
    HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_KV: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    q_start = tl.program_id(0) * BLOCK_Q
    bh = tl.program_id(1).to(tl.int64)
    batch, head = bh // heads, bh % heads
    kv_bh = batch * kv_heads + head // group
    k_ptr += kv_bh * seq_kv * HEAD_DIM
    v_ptr += kv_bh * seq_kv * HEAD_DIM
    mask_ptr += batch * mask_stride_b + head * mask_stride_h
    rq = q_start + tl.arange(0, BLOCK_Q)
    rd = tl.arange(0, HEAD_PAD)
    d_mask = rd < HEAD_DIM
    q_mask = (rq[:, None] < seq_q) & d_mask[None, :]
    offsets = bh * seq_q * HEAD_DIM + rq.to(tl.int64)[:, None] * HEAD_DIM + rd[None, :]
    q = tl.load(q_ptr + offsets, mask=q_mask, other=0.0)
    do = tl.load(grad_ptr + offsets, mask=q_mask, other=0.0)
    lse, delta = _row_stats(lse_ptr + bh * seq_q, delta_ptr + bh * seq_q, rq, seq_q)
    dq = tl.zeros([BLOCK_Q, HEAD_PAD], tl.float32)
    lo, hi = _dq_range(q_start, seq_q, seq_kv, diagonal, BLOCK_Q, BLOCK_KV, CAUSAL, HAS_MASK)
    dq = _dq_blocks(
        dq, q, do, lse, delta, k_ptr, v_ptr, mask_ptr, rq, d_mask, 0, lo, seq_q, seq_kv, diagonal, qk_scale,
        mask_stride_q, mask_stride_kv, HEAD_DIM, HEAD_PAD, BLOCK_KV, False, CAUSAL, HAS_MASK, PRECISION,
    )  # fmt: skip
    dq = _dq_blocks(
        dq, q, do, lse, delta, k_ptr, v_ptr, mask_ptr, rq, d_mask, lo, hi, seq_q, seq_kv, diagonal, qk_scale,
        mask_stride_q, mask_stride_kv, HEAD_DIM, HEAD_PAD, BLOCK_KV, True, CAUSAL, HAS_MASK, PRECISION,
    )  # fmt: skip
    tl.store(dq_ptr + offsets, (dq * scale).to(dq_ptr.dtype.element_ty), mask=q_mask)


def fused_attention_backward(
    saved: tuple[torch.Tensor, ...],
    mask: torch.Tensor | None,
    grads: tuple[torch.Tensor, torch.Tensor | None],
    outputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    blocks: tuple[int, int],
    causal: int,
    scale: float,
    options: Mapping[str, object],
) -> None:
    """Attention backward into ``outputs = (dq, dk, dv)`` (allocated by the caller, of q's, k's and
    v's sizes and dtypes, contiguous).

    ``saved = (q, k, v, out, lse)``: contiguous ``q``/``out [batch, heads, seq_q, head_dim]``,
    ``k``/``v [batch, kv_heads, seq_kv, head_dim]`` (query head ``h`` reads kv head ``h // (heads //
    kv_heads)``) and the forward's float32 ``lse [batch, heads, seq_q]`` (natural log, ``-inf`` on a
    row that sees no key). ``mask``: None or the forward's additive mask (``[batch or 1, heads or 1,
    seq_q or 1, seq_kv or 1]``, any strides). ``grads = (grad_out, grad_lse)``: ``grad_out`` contiguous
    as ``out``, ``grad_lse`` None or float32 contiguous as ``lse``. ``causal``: 0, 1 (top-left) or 2
    (bottom-right); ``blocks = (block_q, block_kv)``.
    """
    q, k, v, out, lse = saved
    grad, grad_lse = grads
    dq, dk, dv = outputs
    batch, heads, seq_q, head_dim = q.shape
    kv_heads, seq_kv = k.shape[1], k.shape[2]
    if kv_heads < 1 or heads % kv_heads:
        raise ValueError(f"{heads} query heads do not split into groups over {kv_heads} kv heads")
    if causal not in {0, 1, 2}:
        raise ValueError(f"causal is 0 (none), 1 (top-left) or 2 (bottom-right), got {causal}")
    strides = mask_strides(mask, (batch, heads, seq_q, seq_kv))
    block_q, block_kv = blocks
    head_pad = padded_head_dim(head_dim)
    delta = torch.empty_like(lse)
    _preprocess_kernel[(triton.cdiv(seq_q, block_q), batch * heads)](
        out, grad, lse if grad_lse is None else grad_lse, delta, seq_q,
        HEAD_DIM=head_dim, HEAD_PAD=head_pad, BLOCK_Q=block_q, HAS_GRAD_LSE=grad_lse is not None,
    )  # fmt: skip
    common = (heads, kv_heads, heads // kv_heads, seq_q, seq_kv, seq_kv - seq_q if causal == 2 else 0)
    constants = {
        "HEAD_DIM": head_dim,
        "HEAD_PAD": head_pad,
        "BLOCK_Q": block_q,
        "BLOCK_KV": block_kv,
        "CAUSAL": causal != 0,
        "HAS_MASK": mask is not None,
        "PRECISION": dot_precision(q.dtype),
    }
    mask_or_q = q if mask is None else mask
    _dkdv_kernel[(triton.cdiv(seq_kv, block_kv), batch * kv_heads)](
        q, k, v, grad, lse, delta, mask_or_q, dk, dv, *common, scale, scale * LOG2_E, *strides,
        **constants, **options,
    )  # fmt: skip
    _dq_kernel[(triton.cdiv(seq_q, block_q), batch * heads)](
        q, k, v, grad, lse, delta, mask_or_q, dq, *common, scale, scale * LOG2_E, *strides,
        **constants, **options,
    )  # fmt: skip
