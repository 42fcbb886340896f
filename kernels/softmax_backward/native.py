"""``native_softmax_backward``: ``softmax_backward`` in C++ (``kernels/native/csrc/softmax_backward.cpp``),
tiles over cores.

Its declaration (knobs, tile count) is
:class:`~tiletune.kernels.softmax_backward.declaration.NativeSoftmaxBackwardDeclaration`.

Knobs: the row-wise kernels' (``tile_rows``, ``tile_cols``, ``buffer_num``, ``pipeline_depth``) and
``block_dim``; a core takes a contiguous range of row tiles, and prefetches the tile
``pipeline_depth - 1`` steps ahead. Whole-row tiles are computed where they lie (``s`` from ``y``
and ``g``, then ``dx`` from them again, by then in L1/L2): copying long rows into slots first cost
15-20%, so ``buffer_num`` does not change them. Column tiles narrower than the row take two passes,
as in the portable kernel: ``s`` from global memory, then each column tile copied into slot
``step % buffer_num`` of the ``y`` and ``g`` queues and ``dx`` written from the slots.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

import torch

from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.native.spec import NativeSpec
from tiletune.kernels.softmax_backward.declaration import NativeSoftmaxBackwardDeclaration
from tiletune.kernels.softmax_backward.portable import SoftmaxBackwardSpec


class NativeSoftmaxBackwardSpec(NativeSoftmaxBackwardDeclaration, NativeSpec, SoftmaxBackwardSpec):
    """``softmax_backward`` as a native CPU kernel."""

    def launch(
        self, module: ModuleType, inputs: Sequence[torch.Tensor], config: Config, shape: Shape
    ) -> torch.Tensor:
        """The extension's ``softmax_backward`` on ``rows x cols``, shaped like ``y``."""
        y, grad = inputs
        matrix = y.dim() == 2  # the common case: no reshape or view to pay for per call
        dx: torch.Tensor = module.softmax_backward(
            y if matrix else y.reshape(-1, shape["cols"]),
            grad if matrix else grad.reshape(-1, shape["cols"]),
            config["tile_rows"],
            config["tile_cols"],
            config["block_dim"],
            config["buffer_num"],
            config["pipeline_depth"],
        )
        return dx if matrix else dx.view(y.shape)


SPEC = NativeSoftmaxBackwardSpec()
