"""The GPU check's faulting kernel, ``@triton.jit``: imported (and triton with it) on its first run."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit  # type: ignore[untyped-decorator]
def _double(x_ptr, out_ptr, n, offset, block: tl.constexpr):  # type: ignore[no-untyped-def]
    """``out[i + offset] = 2 * x[i]`` for the ``block`` elements of this program."""
    index = tl.program_id(0) * block + tl.arange(0, block)
    inside = index < n
    values = tl.load(x_ptr + index, mask=inside)
    tl.store(out_ptr + index + offset, values * 2, mask=inside)


def double(x: torch.Tensor, out: torch.Tensor, tile: int, offset: int) -> None:
    """Launch over ``x``, ``tile`` elements per program (``offset`` 0 is correct; a huge one faults)."""
    n = x.numel()
    _double[(triton.cdiv(n, tile),)](x, out, n, offset, block=tile)
