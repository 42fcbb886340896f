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
from tiletune.kernels.rms_norm.portable import EPS as RMS_EPS
from tiletune.kernels.triton.spec import interpreting

#: Whether ``@triton.jit`` below made interpreted kernels (it reads TRITON_INTERPRET when decorating).
INTERPRETED: bool = interpreting()
#: Output tiles per group in ``matmul``'s grouped launch order (L2 reuse of A's rows).
MATMUL_GROUP_M = 8
LOG2_E = math.log2(math.e)


def _dot_precision(dtype: torch.dtype) -> str | None:
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
        RMS_EPS,
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
    a_rows = a_ptr + rm.to(tl.int64)[:, None] * k
    b_cols = b_ptr + rn[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in tl.range(0, k, BLOCK_K):
        kk = k0 + rk
        a = tl.load(a_rows + kk[None, :], mask=(rm[:, None] < m) & (kk[None, :] < k), other=0.0)
        b = tl.load(
            b_cols + kk.to(tl.int64)[:, None] * n, mask=(kk[:, None] < k) & (rn[None, :] < n), other=0.0
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
    """``c = a @ b`` for contiguous ``a [m, k]``, ``b [k, n]``, float32 accumulation."""
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
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        GROUP_M=MATMUL_GROUP_M,
        PRECISION=_dot_precision(a.dtype),
        **options,
    )


# -- fused attention ------------------------------------------------------------


@triton.jit  # type: ignore[untyped-decorator]
def _attention_blocks(  # type: ignore[no-untyped-def]
    acc,
    row_max,
    row_sum,
    q,
    k_ptr,
    v_ptr,
    rq,
    d_mask,
    lo,
    hi,
    seq_kv,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_KV: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Fold kv blocks ``lo..hi`` into the online softmax; mask only when ``MASKED``.

    ``qk_scale`` is ``log2(e) / sqrt(head_dim)``: scores are in base 2, so ``exp2`` replaces ``exp``.
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
            keep = kv_mask[None, :]
            if CAUSAL:
                keep = keep & (kv[None, :] <= rq[:, None])
            scores = tl.where(keep, scores, -float("inf"))
        new_max = tl.maximum(row_max, tl.max(scores, axis=1))
        p = tl.exp2(scores - new_max[:, None])
        rescale = tl.exp2(row_max - new_max)
        row_sum = row_sum * rescale + tl.sum(p, axis=1)
        acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        row_max = new_max
    return acc, row_max, row_sum


@triton.jit  # type: ignore[untyped-decorator]
def _attention_kernel(  # type: ignore[no-untyped-def]
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    seq_q,
    seq_kv,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_KV: tl.constexpr,
    CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr,
):
    q_start = tl.program_id(0) * BLOCK_Q
    bh = tl.program_id(1).to(tl.int64)
    q_ptr += bh * seq_q * HEAD_DIM
    out_ptr += bh * seq_q * HEAD_DIM
    k_ptr += bh * seq_kv * HEAD_DIM
    v_ptr += bh * seq_kv * HEAD_DIM
    rq = q_start + tl.arange(0, BLOCK_Q)
    rd = tl.arange(0, HEAD_PAD)
    d_mask = rd < HEAD_DIM
    q_mask = (rq[:, None] < seq_q) & d_mask[None, :]
    q = tl.load(q_ptr + rq.to(tl.int64)[:, None] * HEAD_DIM + rd[None, :], mask=q_mask, other=0.0)
    row_max = tl.full([BLOCK_Q], -float("inf"), tl.float32)
    row_sum = tl.zeros([BLOCK_Q], tl.float32)
    acc = tl.zeros([BLOCK_Q, HEAD_PAD], tl.float32)
    full_blocks = seq_kv // BLOCK_KV
    if CAUSAL:  # blocks wholly below the diagonal need no mask; the rest up to the block's last query do
        lo = tl.minimum((q_start + 1) // BLOCK_KV, full_blocks) * BLOCK_KV
        hi = tl.minimum(seq_kv, q_start + BLOCK_Q)
    else:
        lo = full_blocks * BLOCK_KV
        hi = seq_kv
    acc, row_max, row_sum = _attention_blocks(
        acc, row_max, row_sum, q, k_ptr, v_ptr, rq, d_mask, 0, lo, seq_kv, qk_scale,
        HEAD_DIM, BLOCK_KV, HEAD_PAD, False, CAUSAL, PRECISION,
    )  # fmt: skip
    acc, row_max, row_sum = _attention_blocks(
        acc, row_max, row_sum, q, k_ptr, v_ptr, rq, d_mask, lo, hi, seq_kv, qk_scale,
        HEAD_DIM, BLOCK_KV, HEAD_PAD, True, CAUSAL, PRECISION,
    )  # fmt: skip
    out = acc / row_sum[:, None]
    tl.store(
        out_ptr + rq.to(tl.int64)[:, None] * HEAD_DIM + rd[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=q_mask,
    )


def fused_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    blocks: tuple[int, int],
    causal: bool,
    options: Mapping[str, object],
) -> None:
    """Attention forward of contiguous ``[batch*heads, seq, head_dim]`` tensors into ``out``."""
    bh, seq_q, head_dim = q.shape
    block_q, block_kv = blocks
    grid = (triton.cdiv(seq_q, block_q), bh)
    _attention_kernel[grid](
        q,
        k,
        v,
        out,
        seq_q,
        k.shape[1],
        head_dim**-0.5 * LOG2_E,
        HEAD_DIM=head_dim,
        HEAD_PAD=padded_head_dim(head_dim),
        BLOCK_Q=block_q,
        BLOCK_KV=block_kv,
        CAUSAL=causal,
        PRECISION=_dot_precision(q.dtype),
        **options,
    )
