"""``native_matmul``: :mod:`~tiletune.kernels.matmul` in C++ (``csrc/matmul.cpp``) over MKL's ``sgemm_``.

Knobs: ``matmul``'s (``tile_m``, ``tile_n``, ``tile_k``, ``buffer_num``, ``pipeline_depth``)
and ``block_dim``. A core takes a contiguous range of output tiles; a k step copies the A
and B blocks into float32 slots (half/bfloat16; float32 blocks are read in place through
their leading dimensions, ``sgemm_`` packing them itself) and a single-threaded ``sgemm_``
(torch's own MKL, exported by ``libtorch_cpu``) accumulates them into the tile's float32
accumulator slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

import torch

from tiletune.kernels.matmul import MatmulSpec
from tiletune.kernels.native_spec import NativeSpec, with_block_dim
from tiletune.kernels.spec import Config, Shape


class NativeMatmulSpec(NativeSpec, MatmulSpec):
    """``matmul`` as a native CPU kernel."""

    name = "native_matmul"
    version = 1
    description = "C = A @ B, native CPU: output tiles over block_dim cores, k blocks through sgemm_"
    portable = MatmulSpec
    knobs = with_block_dim(MatmulSpec.knobs)

    def tile_count(self, config: Config, shape: Shape) -> int:
        """Output tiles: ``ceil(m / tile_m) * ceil(n / tile_n)``."""
        return -(-shape["m"] // config["tile_m"]) * -(-shape["n"] // config["tile_n"])

    def launch(
        self, module: ModuleType, inputs: Sequence[torch.Tensor], config: Config, shape: Shape
    ) -> torch.Tensor:
        """The extension's ``matmul``."""
        a, b = inputs
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
