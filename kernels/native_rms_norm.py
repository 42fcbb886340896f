"""``native_rms_norm``: :mod:`~tiletune.kernels.rms_norm` in C++ (``csrc/rows.cpp``), tiles over cores.

Knobs: the row-wise kernels' and ``block_dim``. With whole-row tiles each core copies ``w``
into its local memory once per call; with column tiles ``w``'s slice rides a third queue.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

import torch

from tiletune.kernels.native_softmax import row_tiles
from tiletune.kernels.native_spec import NativeSpec, with_block_dim
from tiletune.kernels.rms_norm import EPS, RmsNormSpec
from tiletune.kernels.softmax import RowKernelSpec
from tiletune.kernels.spec import Config, Shape


class NativeRmsNormSpec(NativeSpec, RmsNormSpec):
    """``rms_norm`` as a native CPU kernel."""

    name = "native_rms_norm"
    version = 1
    description = "y = x / sqrt(mean(x^2) + 1e-6) * w, native CPU: row tiles over block_dim cores"
    portable = RmsNormSpec
    knobs = with_block_dim(RowKernelSpec.knobs)

    def tile_count(self, config: Config, shape: Shape) -> int:
        """Row tiles."""
        return row_tiles(config, shape)

    def launch(
        self, module: ModuleType, inputs: Sequence[torch.Tensor], config: Config, shape: Shape
    ) -> torch.Tensor:
        """The extension's ``rms_norm`` on ``rows x cols``, shaped like ``x``."""
        x, w = inputs
        matrix = x.dim() == 2  # the common case: no reshape or view to pay for per call
        out: torch.Tensor = module.rms_norm(
            x if matrix else x.reshape(-1, shape["cols"]),
            w,
            EPS,
            config["tile_rows"],
            config["tile_cols"],
            config["block_dim"],
            config["buffer_num"],
            config["pipeline_depth"],
        )
        return out if matrix else out.view(x.shape)


SPEC = NativeRmsNormSpec()
