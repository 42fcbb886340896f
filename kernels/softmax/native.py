"""``native_softmax``: ``softmax`` in C++ (``kernels/native/csrc/rows.cpp``), tiles over cores.

Its declaration (knobs, tile count) is
:class:`~tiletune.kernels.softmax.declaration.NativeSoftmaxDeclaration`.

Knobs: the row-wise kernels' (``tile_rows``, ``tile_cols``, ``buffer_num``,
``pipeline_depth``) and ``block_dim``; a core takes a contiguous range of row tiles. Column
tiles narrower than the row take two passes (online softmax statistics, then the output),
as in the portable kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

import torch

from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.native.spec import NativeSpec
from tiletune.kernels.softmax.declaration import NativeSoftmaxDeclaration
from tiletune.kernels.softmax.portable import SoftmaxSpec


class NativeSoftmaxSpec(NativeSoftmaxDeclaration, NativeSpec, SoftmaxSpec):
    """``softmax`` as a native CPU kernel."""

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
