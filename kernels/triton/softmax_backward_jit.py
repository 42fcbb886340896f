# Triton's conventions: compile-time constants (tl.constexpr) are UPPER_CASE, kernels take many
# positional arguments.
# ruff: noqa: N803, PLR0917
"""The ``@triton.jit`` kernel behind ``triton_softmax_backward``, and the function that launches it.

Imported only on the kernel's first run (:func:`tiletune.kernels.triton.spec.triton_kernels` with
``module="softmax_backward_jit"``), so triton is needed only where it runs. ``TRITON_INTERPRET=1``
must be set before that import for the kernel to run on CPU tensors in Triton's interpreter
(``INTERPRETED`` records whether it was).

A program owns ``BLOCK_ROWS`` rows. One pass when ``BLOCK_COLS`` covers the row: load ``y`` and
``g``, ``s = sum(g * y)`` per row, store ``dx = y * (g - s)``. Otherwise a first loop over the
column blocks accumulates ``s`` and a second loads each block again and stores ``dx``. Float32
arithmetic whatever the dtype; the blocks' overhang is masked, so any block size runs any shape.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import triton
import triton.language as tl

from tiletune.kernels.triton.spec import interpreting

#: Whether ``@triton.jit`` below made interpreted kernels (it reads TRITON_INTERPRET when decorating).
INTERPRETED: bool = interpreting()


@triton.jit  # type: ignore[untyped-decorator]
def _softmax_backward_kernel(  # type: ignore[no-untyped-def]
    y_ptr,
    g_ptr,
    dx_ptr,
    rows,
    cols,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_COLS: tl.constexpr,
    ONE_PASS: tl.constexpr,
):
    row = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    row_mask = row < rows
    # Rows past the end read the last row (finite values); their stores are masked.
    base = tl.minimum(row, rows - 1).to(tl.int64)[:, None] * cols
    col = tl.arange(0, BLOCK_COLS)[None, :]
    if ONE_PASS:
        mask = col < cols
        y = tl.load(y_ptr + base + col, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + base + col, mask=mask, other=0.0).to(tl.float32)
        s = tl.sum(y * g, axis=1)
        dx = y * (g - s[:, None])
        tl.store(dx_ptr + base + col, dx.to(dx_ptr.dtype.element_ty), mask=row_mask[:, None] & mask)
    else:
        s = tl.zeros([BLOCK_ROWS], tl.float32)
        for c0 in tl.range(0, cols, BLOCK_COLS):
            mask = c0 + col < cols
            y = tl.load(y_ptr + base + c0 + col, mask=mask, other=0.0).to(tl.float32)
            g = tl.load(g_ptr + base + c0 + col, mask=mask, other=0.0).to(tl.float32)
            s += tl.sum(y * g, axis=1)
        for c0 in tl.range(0, cols, BLOCK_COLS):
            mask = c0 + col < cols
            y = tl.load(y_ptr + base + c0 + col, mask=mask, other=0.0).to(tl.float32)
            g = tl.load(g_ptr + base + c0 + col, mask=mask, other=0.0).to(tl.float32)
            dx = y * (g - s[:, None])
            tl.store(dx_ptr + base + c0 + col, dx.to(dx_ptr.dtype.element_ty), mask=row_mask[:, None] & mask)


def softmax_backward(
    y: torch.Tensor,
    grad: torch.Tensor,
    dx: torch.Tensor,
    block_rows: int,
    block_cols: int,
    options: Mapping[str, object],
) -> None:
    """``dx = y * (g - sum(g * y))`` over the rows of contiguous ``rows x cols`` matrices."""
    rows, cols = y.shape
    _softmax_backward_kernel[(triton.cdiv(rows, block_rows),)](
        y,
        grad,
        dx,
        rows,
        cols,
        BLOCK_ROWS=block_rows,
        BLOCK_COLS=block_cols,
        ONE_PASS=block_cols >= cols,
        **options,
    )
