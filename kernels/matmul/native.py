"""``native_matmul``: ``matmul`` in C++ (``kernels/native/csrc/matmul.cpp``) over MKL's ``sgemm_``.

Knobs: ``matmul``'s (``tile_m``, ``tile_n``, ``tile_k``, ``buffer_num``, ``pipeline_depth``)
and ``block_dim``. A core takes a contiguous range of output tiles; a k step copies the A
and B blocks into float32 slots (half/bfloat16; float32 blocks are read in place through
their leading dimensions, ``sgemm_`` packing them itself) and a single-threaded ``sgemm_``
(torch's own MKL, exported by ``libtorch_cpu``) accumulates them into the tile's float32
accumulator slot.

A transposed operand (``a_transposed`` / ``b_transposed``: strides ``(1, rows)``) is read in
place too: ``sgemm_`` gets it with its transpose flag (a half/bfloat16 block is converted as
stored, into the same slot, and passed transposed). Other strides are made contiguous first
(:func:`~tiletune.kernels.matmul.portable.layout`).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

import torch

from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.matmul.declaration import NativeMatmulDeclaration
from tiletune.kernels.matmul.portable import MatmulSpec, layout
from tiletune.kernels.native.spec import NativeSpec


class NativeMatmulSpec(NativeMatmulDeclaration, NativeSpec, MatmulSpec):
    """``matmul`` as a native CPU kernel."""

    keeps_layout = True

    def launch(
        self, module: ModuleType, inputs: Sequence[torch.Tensor], config: Config, shape: Shape
    ) -> torch.Tensor:
        """The extension's ``matmul`` on the operands as :func:`layout` gives them (row-major or
        transposed, read in place)."""
        (a, _), (b, _) = (layout(t) for t in inputs)
        out: torch.Tensor = module.matmul(
            a,
            b,
            config["tile_m"],
            config["tile_n"],
            config["tile_k"],
            config["block_dim"],
            config["buffer_num"],
            config["pipeline_depth"],
        )
        return out


SPEC = NativeMatmulSpec()
