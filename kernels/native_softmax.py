"""``native_softmax``: :mod:`~tiletune.kernels.softmax` in C++ (``csrc/rows.cpp``), tiles over cores.

Knobs: the row-wise kernels' (``tile_rows``, ``tile_cols``, ``buffer_num``,
``pipeline_depth``) and ``block_dim``; a core takes a contiguous range of row tiles. Column
tiles narrower than the row take two passes (online softmax statistics, then the output),
as in the portable kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

import torch

from tiletune.kernels.native_spec import NativeSpec, with_block_dim
from tiletune.kernels.softmax import RowKernelSpec, SoftmaxSpec
from tiletune.kernels.spec import Config, Shape


def row_tiles(config: Config, shape: Shape) -> int:
    """``ceil(rows / tile_rows)``: the tiles the cores of a row-wise kernel share."""
    return -(-shape["rows"] // config["tile_rows"])


class NativeSoftmaxSpec(NativeSpec, SoftmaxSpec):
    """``softmax`` as a native CPU kernel."""

    name = "native_softmax"
    version = 1
    description = "softmax over the last dim, native CPU: row tiles over block_dim cores"
    portable = SoftmaxSpec
    knobs = with_block_dim(RowKernelSpec.knobs)

    def tile_count(self, config: Config, shape: Shape) -> int:
        """Row tiles."""
        return row_tiles(config, shape)

    def launch(
        self, module: ModuleType, inputs: Sequence[torch.Tensor], config: Config, shape: Shape
    ) -> torch.Tensor:
        """The extension's ``softmax`` on ``rows x cols``, shaped like ``x``."""
        x = inputs[0]
        matrix = x.dim() == 2  # the common case: no reshape or view to pay for per call
        out: torch.Tensor = module.softmax(
            x if matrix else x.reshape(-1, shape["cols"]),
            config["tile_rows"],
            config["tile_cols"],
            config["block_dim"],
            config["buffer_num"],
            config["pipeline_depth"],
        )
        return out if matrix else out.view(x.shape)


SPEC = NativeSoftmaxSpec()
