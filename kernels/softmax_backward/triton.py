"""``triton_softmax_backward``: softmax's gradient ``dx = y * (g - sum(g * y))`` over the last dim, in
Triton.

Its declaration (knobs, working set, default) is
:class:`~tiletune.kernels.softmax_backward.declaration.TritonSoftmaxBackwardDeclaration`;
dims, inputs, reference and counts are ``softmax_backward``'s; the blocking is the row-wise one of
:class:`~tiletune.kernels.softmax.triton.TritonRowSpec`. One pass when ``block_cols`` covers
``cols``; otherwise a first pass accumulates each row's ``s = sum(g * y)`` (float32) over the
column blocks and a second loads each column block of ``y`` and ``g`` again and writes ``dx``
(``kernels/triton/softmax_backward_jit.py``).

Working set: the ``y`` and ``g`` blocks of every stage in flight,
``2 * block_rows * block_cols * element size * num_stages``.

Default: as for every Triton row-wise kernel (see :mod:`tiletune.kernels.softmax.triton`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.softmax.triton import TritonRowSpec
from tiletune.kernels.softmax_backward.declaration import TritonSoftmaxBackwardDeclaration
from tiletune.kernels.softmax_backward.portable import SoftmaxBackwardSpec

#: The module of ``@triton.jit`` kernels this kernel runs (``tiletune.kernels.triton.<module>``).
KERNELS_MODULE = "softmax_backward_jit"


class TritonSoftmaxBackwardSpec(TritonSoftmaxBackwardDeclaration, TritonRowSpec, SoftmaxBackwardSpec):
    """Softmax's gradient of each row in Triton, two passes when a row spans blocks."""

    def run(
        self, inputs: Sequence[torch.Tensor], config: Config, shape: Shape, backend: str = "triton"
    ) -> torch.Tensor:
        """softmax_backward by the Triton kernel."""
        kernels, options = self.prepare_launch(inputs, config, backend, module=KERNELS_MODULE)
        y = self.rows_of(inputs, shape)
        grad = inputs[1].reshape(-1, shape["cols"]).contiguous()
        dx = torch.empty_like(y)
        kernels.softmax_backward(y, grad, dx, config["block_rows"], config["block_cols"], options)
        return dx.view(inputs[0].shape)


SPEC = TritonSoftmaxBackwardSpec()
