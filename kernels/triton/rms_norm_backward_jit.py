# Triton's conventions: compile-time constants (tl.constexpr) are UPPER_CASE, kernels take many
# positional arguments.
# ruff: noqa: N803, PLR0917
"""The ``@triton.jit`` kernel behind ``triton_rms_norm_backward``, and the function that launches it.

Imported only on the kernel's first run (:func:`tiletune.kernels.triton.spec.triton_kernels` with
``module="rms_norm_backward_jit"``), so triton is needed only where it runs. ``TRITON_INTERPRET=1``
must be set before that import for the kernel to run on CPU tensors in Triton's interpreter
(``INTERPRETED`` records whether it was).

With ``r = rsqrt(mean(x^2) + eps)`` per row: ``dx = r g w - x c`` where ``c = r^3 sum(g w x) / cols``,
and ``dw = sum over rows of r g x``. The launch has at most :func:`program_count` programs; program
``p`` takes the row blocks ``p, p + programs, ...`` (``BLOCK_ROWS`` rows each) and keeps float32
partial sums of ``dw`` for its rows: in registers when ``BLOCK_COLS`` covers the row (one pass: load
``x``, ``g`` and ``w``, both statistics, store ``dx``), else in its own row of the partial sums'
matrix (two passes over the column blocks: the statistics, then ``dx`` and ``dw`` block by block).
The launcher adds the programs' rows in order: deterministic for a given config and device. Float32
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
#: Programs of a launch off CUDA (Ascend's AI cores are about this many; the interpreter runs them in turn).
OTHER_PROGRAMS = 32


def program_count(device: torch.device, row_blocks: int) -> int:
    """Programs for ``row_blocks`` blocks of rows: one per multiprocessor on CUDA, else
    :data:`OTHER_PROGRAMS`; never more than the row blocks."""
    if device.type == "cuda":
        programs = torch.cuda.get_device_properties(device).multi_processor_count
    else:
        programs = OTHER_PROGRAMS
    return max(1, min(row_blocks, programs))


@triton.jit  # type: ignore[untyped-decorator]
def _one_pass(  # type: ignore[no-untyped-def]
    x_ptr, w_ptr, g_ptr, dx_ptr, dw_ptr, rows, cols, eps, BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr
):
    """Whole rows: this program's row blocks, ``dw``'s partial sums in registers."""
    pid = tl.program_id(0)
    col = tl.arange(0, BLOCK_COLS)
    mask = col < cols
    w = tl.load(w_ptr + col, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK_COLS], tl.float32)
    for block in tl.range(pid, tl.cdiv(rows, BLOCK_ROWS), tl.num_programs(0)):
        row = block * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        at = row.to(tl.int64)[:, None] * cols + col[None, :]
        inside = (row < rows)[:, None] & mask[None, :]
        x = tl.load(x_ptr + at, mask=inside, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + at, mask=inside, other=0.0).to(tl.float32)
        r = tl.rsqrt(tl.sum(x * x, axis=1) / cols + eps)
        gw = g * w[None, :]
        c = r * r * r * tl.sum(gw * x, axis=1) / cols
        dx = gw * r[:, None] - x * c[:, None]
        tl.store(dx_ptr + at, dx.to(dx_ptr.dtype.element_ty), mask=inside)
        dw += tl.sum(g * x * r[:, None], axis=0)
    tl.store(dw_ptr + pid * cols + col, dw, mask=mask)


@triton.jit  # type: ignore[untyped-decorator]
def _two_pass(  # type: ignore[no-untyped-def]
    x_ptr, w_ptr, g_ptr, dx_ptr, dw_ptr, rows, cols, eps, BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr
):
    """Rows spanning column blocks: the statistics over them, then ``dx`` and ``dw`` block by block
    (``dw``'s partial sums in this program's row of ``dw_ptr``, which starts at zero)."""
    pid = tl.program_id(0)
    col = tl.arange(0, BLOCK_COLS)
    for block in tl.range(pid, tl.cdiv(rows, BLOCK_ROWS), tl.num_programs(0)):
        row = block * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        base = row.to(tl.int64)[:, None] * cols
        squares = tl.zeros([BLOCK_ROWS], tl.float32)
        gwx = tl.zeros([BLOCK_ROWS], tl.float32)
        for c0 in tl.range(0, cols, BLOCK_COLS):
            mask = c0 + col < cols
            inside = (row < rows)[:, None] & mask[None, :]
            x = tl.load(x_ptr + base + c0 + col[None, :], mask=inside, other=0.0).to(tl.float32)
            g = tl.load(g_ptr + base + c0 + col[None, :], mask=inside, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + c0 + col, mask=mask, other=0.0).to(tl.float32)
            squares += tl.sum(x * x, axis=1)
            gwx += tl.sum(g * w[None, :] * x, axis=1)
        r = tl.rsqrt(squares / cols + eps)
        c = r * r * r * gwx / cols
        for c0 in tl.range(0, cols, BLOCK_COLS):
            mask = c0 + col < cols
            inside = (row < rows)[:, None] & mask[None, :]
            x = tl.load(x_ptr + base + c0 + col[None, :], mask=inside, other=0.0).to(tl.float32)
            g = tl.load(g_ptr + base + c0 + col[None, :], mask=inside, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + c0 + col, mask=mask, other=0.0).to(tl.float32)
            dx = g * w[None, :] * r[:, None] - x * c[:, None]
            tl.store(dx_ptr + base + c0 + col[None, :], dx.to(dx_ptr.dtype.element_ty), mask=inside)
            partial = dw_ptr + pid * cols + c0 + col
            tl.store(partial, tl.load(partial, mask=mask) + tl.sum(g * x * r[:, None], axis=0), mask=mask)


@triton.jit  # type: ignore[untyped-decorator]
def _rms_norm_backward_kernel(  # type: ignore[no-untyped-def]
    x_ptr,
    w_ptr,
    g_ptr,
    dx_ptr,
    dw_ptr,
    rows,
    cols,
    eps,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_COLS: tl.constexpr,
    ONE_PASS: tl.constexpr,
):
    if ONE_PASS:
        _one_pass(x_ptr, w_ptr, g_ptr, dx_ptr, dw_ptr, rows, cols, eps, BLOCK_ROWS, BLOCK_COLS)
    else:
        _two_pass(x_ptr, w_ptr, g_ptr, dx_ptr, dw_ptr, rows, cols, eps, BLOCK_ROWS, BLOCK_COLS)


def rms_norm_backward(
    x: torch.Tensor,
    w: torch.Tensor,
    grad: torch.Tensor,
    dx: torch.Tensor,
    eps: float,
    blocks: tuple[int, int],
    options: Mapping[str, object],
) -> torch.Tensor:
    """Write ``dx`` for contiguous ``rows x cols`` matrices ``x`` and ``grad`` at the forward's ``eps``
    (``blocks``: ``(block_rows, block_cols)``) and return ``dw`` (float32): the programs' partial sums
    added in program order."""
    rows, cols = x.shape
    block_rows, block_cols = blocks
    programs = program_count(x.device, triton.cdiv(rows, block_rows))
    partials = torch.zeros((programs, cols), dtype=torch.float32, device=x.device)
    _rms_norm_backward_kernel[(programs,)](
        x,
        w,
        grad,
        dx,
        partials,
        rows,
        cols,
        eps,
        BLOCK_ROWS=block_rows,
        BLOCK_COLS=block_cols,
        ONE_PASS=block_cols >= cols,
        **options,
    )
    return partials.sum(0)
