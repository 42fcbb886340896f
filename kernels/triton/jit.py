# Triton's conventions: compile-time constants (tl.constexpr) are UPPER_CASE, kernels take many
# positional arguments.
# ruff: noqa: N803, PLR0917
"""The ``@triton.jit`` kernels behind the ``triton_*`` specs, and the functions that launch them.

Imported only on a Triton kernel's first run (:func:`tiletune.kernels.triton.spec.triton_kernels`),
so triton is needed only where these kernels run. ``TRITON_INTERPRET=1`` must be
set before that import for the kernels to run on CPU tensors in Triton's
interpreter (``INTERPRETED`` records whether it was).

Every kernel masks its blocks' overhang, so any block size runs any shape.
Launch functions take the block sizes and the launch options the spec computed
(``num_warps``/``num_stages`` on CUDA, ``multibuffer`` on Ascend) and write
into an output tensor the caller allocated.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
import triton
import triton.language as tl

from tiletune.kernels.fused_attention.declaration import padded_head_dim
from tiletune.kernels.triton.spec import interpreting

#: Whether ``@triton.jit`` below made interpreted kernels (it reads TRITON_INTERPRET when decorating).
INTERPRETED: bool = interpreting()
#: Output tiles per group in ``matmul``'s grouped launch order (L2 reuse of A's rows).
MATMUL_GROUP_M = 8
LOG2_E = math.log2(math.e)


def dot_precision(dtype: torch.dtype) -> str | None:
    """float32 dots in full precision (TF32 would miss the float32 tolerance); others the default."""
    return "ieee" if dtype == torch.float32 else None


# -- add ------------------------------------------------------------------------


@triton.jit  # type: ignore[untyped-decorator]
def _add_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK_SIZE: tl.constexpr, TILES: tl.constexpr):  # type: ignore[no-untyped-def]
    start = tl.program_id(0).to(tl.int64) * (BLOCK_SIZE * TILES)
    offsets = tl.arange(0, BLOCK_SIZE)
    for tile in tl.range(0, TILES):
        index = start + tile * BLOCK_SIZE + offsets
        mask = index < n
        a = tl.load(a_ptr + index, mask=mask)
        b = tl.load(b_ptr + index, mask=mask)
        tl.store(out_ptr + index, a + b, mask=mask)


def add(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    blocks: tuple[int, int],
    options: Mapping[str, object],
) -> None:
    """``out = a + b`` over flat tensors; ``blocks``: (block size, blocks per program)."""
    n = a.numel()
    block_size, tiles = blocks
    grid = (triton.cdiv(n, block_size * tiles),)
    _add_kernel[grid](a, b, out, n, BLOCK_SIZE=block_size, TILES=tiles, **options)


# -- softmax and rms_norm (row-wise) ----------------------------------------------


@triton.jit  # type: ignore[untyped-decorator]
def _softmax_kernel(  # type: ignore[no-untyped-def]
    x_ptr, out_ptr, rows, cols, BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr, ONE_PASS: tl.constexpr
):
    row = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    row_mask = row < rows
    # Rows past the end read the last row (finite values, no NaN); their stores are masked.
    base = tl.minimum(row, rows - 1).to(tl.int64)[:, None] * cols
    col = tl.arange(0, BLOCK_COLS)[None, :]
    if ONE_PASS:
        mask = col < cols
        x = tl.load(x_ptr + base + col, mask=mask, other=-float("inf")).to(tl.float32)
        e = tl.exp(x - tl.max(x, axis=1)[:, None])
        y = e / tl.sum(e, axis=1)[:, None]
        tl.store(out_ptr + base + col, y.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & mask)
    else:
        row_max = tl.full([BLOCK_ROWS], -float("inf"), tl.float32)
        row_sum = tl.zeros([BLOCK_ROWS], tl.float32)
        for c0 in tl.range(0, cols, BLOCK_COLS):  # online softmax: running max and rescaled sum
            mask = c0 + col < cols
            x = tl.load(x_ptr + base + c0 + col, mask=mask, other=-float("inf")).to(tl.float32)
            new_max = tl.maximum(row_max, tl.max(x, axis=1))
            row_sum = row_sum * tl.exp(row_max - new_max) + tl.sum(tl.exp(x - new_max[:, None]), axis=1)
            row_max = new_max
        for c0 in tl.range(0, cols, BLOCK_COLS):
            mask = c0 + col < cols
            x = tl.load(x_ptr + base + c0 + col, mask=mask, other=-float("inf")).to(tl.float32)
            y = tl.exp(x - row_max[:, None]) / row_sum[:, None]
            tl.store(out_ptr + base + c0 + col, y.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & mask)


def softmax(
    x: torch.Tensor, out: torch.Tensor, block_rows: int, block_cols: int, options: Mapping[str, object]
) -> None:
    """Softmax over the rows of a contiguous ``rows x cols`` matrix."""
    rows, cols = x.shape
    _softmax_kernel[(triton.cdiv(rows, block_rows),)](
        x,
        out,
        rows,
        cols,
        BLOCK_ROWS=block_rows,
        BLOCK_COLS=block_cols,
        ONE_PASS=block_cols >= cols,
        **options,
    )


@triton.jit  # type: ignore[untyped-decorator]
def _rms_norm_kernel(  # type: ignore[no-untyped-def]
    x_ptr,
    w_ptr,
    out_ptr,
    rows,
    cols,
    eps,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_COLS: tl.constexpr,
    ONE_PASS: tl.constexpr,
):
    row = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    row_mask = row < rows
    base = tl.minimum(row, rows - 1).to(tl.int64)[:, None] * cols
    col = tl.arange(0, BLOCK_COLS)
    if ONE_PASS:
        mask = col < cols
        x = tl.load(x_ptr + base + col[None, :], mask=mask[None, :], other=0.0).to(tl.float32)
        scale = tl.rsqrt(tl.sum(x * x, axis=1) / cols + eps)
        w = tl.load(w_ptr + col, mask=mask, other=0.0).to(tl.float32)
        y = x * scale[:, None] * w[None, :]
        tl.store(out_ptr + base + col[None, :], y.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & mask)
    else:
        squares = tl.zeros([BLOCK_ROWS], tl.float32)
        for c0 in tl.range(0, cols, BLOCK_COLS):
            mask = c0 + col < cols
            x = tl.load(x_ptr + base + c0 + col[None, :], mask=mask[None, :], other=0.0).to(tl.float32)
            squares += tl.sum(x * x, axis=1)
        scale = tl.rsqrt(squares / cols + eps)
        for c0 in tl.range(0, cols, BLOCK_COLS):
            mask = c0 + col < cols
            x = tl.load(x_ptr + base + c0 + col[None, :], mask=mask[None, :], other=0.0).to(tl.float32)
            w = tl.load(w_ptr + c0 + col, mask=mask, other=0.0).to(tl.float32)
            y = x * scale[:, None] * w[None, :]
            tl.store(
                out_ptr + base + c0 + col[None, :],
                y.to(out_ptr.dtype.element_ty),
                mask=row_mask[:, None] & mask[None, :],
            )


def rms_norm(
    x: torch.Tensor,
    w: torch.Tensor,
    out: torch.Tensor,
    eps: float,
    block_rows: int,
    block_cols: int,
    options: Mapping[str, object],
) -> None:
    """``x * rsqrt(mean(x^2) + eps) * w`` over the rows of a contiguous ``rows x cols`` matrix."""
    rows, cols = x.shape
    _rms_norm_kernel[(triton.cdiv(rows, block_rows),)](
        x,
        w,
        out,
        rows,
        cols,
        eps,
        BLOCK_ROWS=block_rows,
        BLOCK_COLS=block_cols,
        ONE_PASS=block_cols >= cols,
        **options,
    )


# -- matmul -----------------------------------------------------------------------


@triton.jit  # type: ignore[untyped-decorator]
def _matmul_kernel(  # type: ignore[no-untyped-def]
    a_ptr,
    b_ptr,
    c_ptr,
    m,
    n,
    k,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    PRECISION: tl.constexpr,
):
    pid = tl.program_id(0)
    tiles_m, tiles_n = tl.cdiv(m, BLOCK_M), tl.cdiv(n, BLOCK_N)
    group = GROUP_M * tiles_n  # programs of GROUP_M consecutive tile rows, column by column
    first_m = (pid // group) * GROUP_M
    group_m = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % group_m
    pid_n = (pid % group) // group_m
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    # Through the strides: a transposed operand (stride 1 along m or n) is read in place.
    a_rows = a_ptr + rm.to(tl.int64)[:, None] * stride_am
    b_cols = b_ptr + rn.to(tl.int64)[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in tl.range(0, k, BLOCK_K):
        kk = k0 + rk
        a = tl.load(
            a_rows + kk.to(tl.int64)[None, :] * stride_ak,
            mask=(rm[:, None] < m) & (kk[None, :] < k),
            other=0.0,
        )
        b = tl.load(
            b_cols + kk.to(tl.int64)[:, None] * stride_bk,
            mask=(kk[:, None] < k) & (rn[None, :] < n),
            other=0.0,
        )
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    c = c_ptr + rm.to(tl.int64)[:, None] * n + rn[None, :]
    tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < m) & (rn[None, :] < n))


def matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    blocks: tuple[int, int, int],
    options: Mapping[str, object],
) -> None:
    """``c = a @ b`` for ``a [m, k]``, ``b [k, n]`` of any strides (read through them: a transposed
    operand in place), contiguous ``c``, float32 accumulation."""
    (m, k), n = a.shape, b.shape[1]
    block_m, block_n, block_k = blocks
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n),)
    _matmul_kernel[grid](
        a,
        b,
        c,
        m,
        n,
        k,
        a.stride(0),
        a.stride(1),
        b.stride(0),
        b.stride(1),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        GROUP_M=MATMUL_GROUP_M,
        PRECISION=dot_precision(a.dtype),
        **options,
    )


# -- fused attention ------------------------------------------------------------

#: Scores are kept in base 2 (``exp2``): an additive mask is scaled by ``log2(e)``, and the row's
#: base-2 maximum by ``ln(2)`` for the natural-log log-sum-exp.
_LOG2_E: tl.constexpr = tl.constexpr(LOG2_E)
_LN_2: tl.constexpr = tl.constexpr(math.log(2.0))


@triton.jit  # type: ignore[untyped-decorator]
def _attention_blocks(  # type: ignore[no-untyped-def]
    acc, row_max, row_sum, q, k_ptr, v_ptr, mask_ptr, rq, d_mask, lo, hi, seq_q, seq_kv, diagonal,
    qk_scale, mask_stride_q, mask_stride_kv,
    HEAD_DIM: tl.constexpr, BLOCK_KV: tl.constexpr, HEAD_PAD: tl.constexpr, MASKED: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """Fold kv blocks ``lo..hi`` into the online softmax; mask only when ``MASKED``.

    ``qk_scale`` is ``scale * log2(e)``: scores are in base 2, so ``exp2`` replaces ``exp``. Masked:
    keys past ``seq_kv`` and (``CAUSAL``) keys ``j > i + diagonal`` are ``-inf``, the additive mask
    (``HAS_MASK``) is added times ``log2(e)``. A row with no visible key yet keeps max ``-inf``, sum 0.
    """
    rkv = tl.arange(0, BLOCK_KV)
    rd = tl.arange(0, HEAD_PAD)
    for start in tl.range(lo, hi, BLOCK_KV):
        kv = start + rkv
        kv_mask = kv < seq_kv
        load_mask = kv_mask[:, None] & d_mask[None, :]
        k = tl.load(k_ptr + kv.to(tl.int64)[:, None] * HEAD_DIM + rd[None, :], mask=load_mask, other=0.0)
        v = tl.load(v_ptr + kv.to(tl.int64)[:, None] * HEAD_DIM + rd[None, :], mask=load_mask, other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        if MASKED:
            if HAS_MASK:
                offsets = rq.to(tl.int64)[:, None] * mask_stride_q + kv.to(tl.int64)[None, :] * mask_stride_kv
                bias_mask = (rq[:, None] < seq_q) & kv_mask[None, :]
                bias = tl.load(mask_ptr + offsets, mask=bias_mask, other=0.0)
                scores += bias.to(tl.float32) * _LOG2_E
            keep = kv_mask[None, :]
            if CAUSAL:
                keep = keep & (kv[None, :] <= rq[:, None] + diagonal)
            scores = tl.where(keep, scores, -float("inf"))
        new_max = tl.maximum(row_max, tl.max(scores, axis=1))
        shift = tl.where(new_max == -float("inf"), 0.0, new_max)  # no -inf - -inf on empty rows
        p = tl.exp2(scores - shift[:, None])
        rescale = tl.exp2(row_max - shift)
        row_sum = row_sum * rescale + tl.sum(p, axis=1)
        acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        row_max = new_max
    return acc, row_max, row_sum


@triton.jit  # type: ignore[untyped-decorator]
def _attention_range(  # type: ignore[no-untyped-def]
    q_start, seq_q, seq_kv, diagonal,
    BLOCK_Q: tl.constexpr, BLOCK_KV: tl.constexpr, CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr,
):  # fmt: skip
    """``(lo, hi)`` for the q block at ``q_start``: kv blocks before ``lo`` need no mask, ``lo..hi``
    do, keys from ``hi`` on are seen by none of its queries (causal: key ``j`` is visible to query
    ``i`` when ``j <= i + diagonal``). With ``HAS_MASK`` every block is masked (``lo = 0``)."""
    full = (seq_kv // BLOCK_KV) * BLOCK_KV
    if CAUSAL:
        # Keys up to q_start + diagonal are seen by every query of the block; the block's last
        # query sees up to its own index + diagonal.
        seen_by_all = tl.maximum(q_start + diagonal + 1, 0)
        lo = tl.minimum((seen_by_all // BLOCK_KV) * BLOCK_KV, full)
        hi = tl.minimum(tl.maximum(tl.minimum(q_start + BLOCK_Q, seq_q) + diagonal, 0), seq_kv)
    else:
        lo = full
        hi = seq_kv
    if HAS_MASK:
        lo = 0
    return lo, hi


@triton.jit  # type: ignore[untyped-decorator]
def _attention_kernel(  # type: ignore[no-untyped-def]
    q_ptr, k_ptr, v_ptr, mask_ptr, out_ptr, lse_ptr, heads, kv_heads, group, seq_q, seq_kv, diagonal,
    qk_scale, mask_stride_b, mask_stride_h, mask_stride_q, mask_stride_kv,
    HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_KV: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    q_start = tl.program_id(0) * BLOCK_Q
    bh = tl.program_id(1).to(tl.int64)
    batch, head = bh // heads, bh % heads
    kv_bh = batch * kv_heads + head // group  # grouped-query attention: ``group`` q heads per kv head
    q_ptr += bh * seq_q * HEAD_DIM
    out_ptr += bh * seq_q * HEAD_DIM
    lse_ptr += bh * seq_q
    k_ptr += kv_bh * seq_kv * HEAD_DIM
    v_ptr += kv_bh * seq_kv * HEAD_DIM
    mask_ptr += batch * mask_stride_b + head * mask_stride_h
    rq = q_start + tl.arange(0, BLOCK_Q)
    rd = tl.arange(0, HEAD_PAD)
    d_mask = rd < HEAD_DIM
    q_mask = (rq[:, None] < seq_q) & d_mask[None, :]
    q = tl.load(q_ptr + rq.to(tl.int64)[:, None] * HEAD_DIM + rd[None, :], mask=q_mask, other=0.0)
    row_max = tl.full([BLOCK_Q], -float("inf"), tl.float32)
    row_sum = tl.zeros([BLOCK_Q], tl.float32)
    acc = tl.zeros([BLOCK_Q, HEAD_PAD], tl.float32)
    lo, hi = _attention_range(q_start, seq_q, seq_kv, diagonal, BLOCK_Q, BLOCK_KV, CAUSAL, HAS_MASK)
    acc, row_max, row_sum = _attention_blocks(
        acc, row_max, row_sum, q, k_ptr, v_ptr, mask_ptr, rq, d_mask, 0, lo, seq_q, seq_kv, diagonal,
        qk_scale, mask_stride_q, mask_stride_kv, HEAD_DIM, BLOCK_KV, HEAD_PAD, False, CAUSAL, HAS_MASK,
        PRECISION,
    )  # fmt: skip
    acc, row_max, row_sum = _attention_blocks(
        acc, row_max, row_sum, q, k_ptr, v_ptr, mask_ptr, rq, d_mask, lo, hi, seq_q, seq_kv, diagonal,
        qk_scale, mask_stride_q, mask_stride_kv, HEAD_DIM, BLOCK_KV, HEAD_PAD, True, CAUSAL, HAS_MASK,
        PRECISION,
    )  # fmt: skip
    seen = row_sum > 0.0  # rows with no visible key: out 0, lse -inf
    out = tl.where(seen[:, None], acc / tl.where(seen, row_sum, 1.0)[:, None], 0.0)
    lse = tl.where(seen, row_max * _LN_2 + tl.log(tl.where(seen, row_sum, 1.0)), -float("inf"))
    tl.store(
        out_ptr + rq.to(tl.int64)[:, None] * HEAD_DIM + rd[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=q_mask,
    )
    tl.store(lse_ptr + rq, lse, mask=rq < seq_q)


def mask_strides(mask: torch.Tensor | None, full: tuple[int, int, int, int]) -> tuple[int, ...]:
    """``mask``'s element strides, 0 on its size-1 (broadcast) dims; all 0 without a mask."""
    if mask is None:
        return (0, 0, 0, 0)
    if mask.dim() != 4 or any(size not in {1, n} for size, n in zip(mask.shape, full, strict=True)):
        raise ValueError(f"attention mask of size {list(mask.shape)} does not broadcast to {list(full)}")
    if not mask.is_floating_point():
        raise ValueError(f"attention mask must be additive (floating point), got {mask.dtype}")
    return tuple(0 if size == 1 else stride for size, stride in zip(mask.shape, mask.stride(), strict=True))


def fused_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    out: torch.Tensor,
    lse: torch.Tensor,
    blocks: tuple[int, int],
    causal: int,
    scale: float,
    options: Mapping[str, object],
) -> None:
    """Attention forward: ``out = softmax(q k^T * scale + mask) v``, ``lse`` its rows' log-sum-exp.

    ``q [batch, heads, seq_q, head_dim]``, ``k``/``v [batch, kv_heads, seq_kv, head_dim]`` and
    ``out`` (``q``'s size) contiguous; ``heads % kv_heads == 0``, query head ``h`` reads kv head
    ``h // (heads // kv_heads)``. ``mask``: None or an additive mask ``[batch or 1, heads or 1,
    seq_q or 1, seq_kv or 1]`` (any strides; size-1 dims broadcast). ``causal``: 0 none, 1 top-left
    (query ``i`` sees keys ``j <= i``), 2 bottom-right (``j <= i + seq_kv - seq_q``). ``lse``:
    float32 ``[batch, heads, seq_q]``, natural log of each row's ``sum(exp(scaled masked scores))``.
    A row that sees no key gets ``out`` 0 and ``lse`` ``-inf``.
    """
    batch, heads, seq_q, head_dim = q.shape
    kv_heads, seq_kv = k.shape[1], k.shape[2]
    if kv_heads < 1 or heads % kv_heads:
        raise ValueError(f"{heads} query heads do not split into groups over {kv_heads} kv heads")
    if causal not in {0, 1, 2}:
        raise ValueError(f"causal is 0 (none), 1 (top-left) or 2 (bottom-right), got {causal}")
    strides = mask_strides(mask, (batch, heads, seq_q, seq_kv))
    block_q, block_kv = blocks
    grid = (triton.cdiv(seq_q, block_q), batch * heads)
    _attention_kernel[grid](
        q, k, v, q if mask is None else mask, out, lse,
        heads, kv_heads, heads // kv_heads, seq_q, seq_kv, seq_kv - seq_q if causal == 2 else 0,
        scale * LOG2_E, *strides,
        HEAD_DIM=head_dim,
        HEAD_PAD=padded_head_dim(head_dim),
        BLOCK_Q=block_q,
        BLOCK_KV=block_kv,
        CAUSAL=causal != 0,
        HAS_MASK=mask is not None,
        PRECISION=dot_precision(q.dtype),
        **options,
    )  # fmt: skip
