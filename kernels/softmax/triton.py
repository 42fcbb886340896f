"""``triton_softmax``: ``softmax`` over the last dim of a ``rows x cols`` matrix, in Triton.

Its declaration (knobs, working set, default) is
:class:`~tiletune.kernels.softmax.declaration.TritonSoftmaxDeclaration`;
dims, inputs, reference and counts are ``softmax``'s. Shared with
``triton_rms_norm`` through :class:`TritonRowSpec`: a program owns
``block_rows`` rows and walks them in ``block_cols`` column blocks. When
``block_cols`` covers ``cols`` a program loads its rows once (one pass, no
loop: ``num_stages`` must be 1); otherwise it makes two passes over the column
blocks, both loops pipelined by ``num_stages``: the first keeps the online
softmax's running max and rescaled sum per row, the second writes
``exp(x - max) / sum``. Statistics are float32 whatever the dtype.

Working set: the ``block_rows x block_cols`` input block of every stage in
flight, ``block_rows * block_cols * element size * num_stages``.

Default (the hand-written rule, ``total = rows * cols``):
``heuristic_tiling(total, element size, local memory)`` gives tile elements
``E``. For ``total <= 1024`` (one tile of everything) both blocks cover their
dim. Otherwise whole rows when ``cols <= E`` (``block_cols`` the smallest power
of two covering ``cols``), else ``block_cols = E``; ``block_rows = E //
block_cols`` snapped down (at least 1). ``num_stages`` = the rule's depth (1 for
one pass), ``num_warps`` = 4 (see :meth:`TritonSpec.launch_defaults`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.softmax.declaration import TritonRowDeclaration, TritonSoftmaxDeclaration
from tiletune.kernels.softmax.portable import RowKernelSpec, SoftmaxSpec
from tiletune.kernels.triton.spec import TritonSpec


class TritonRowSpec(TritonRowDeclaration, TritonSpec, RowKernelSpec):
    """A row-wise Triton kernel: ``block_rows`` rows per program, ``block_cols`` columns per step."""

    def rows_of(self, inputs: Sequence[torch.Tensor], shape: Shape) -> torch.Tensor:
        """``x`` as a contiguous ``rows x cols`` matrix, whatever the caller's leading dims."""
        return inputs[0].reshape(-1, shape["cols"]).contiguous()


class TritonSoftmaxSpec(TritonSoftmaxDeclaration, TritonRowSpec, SoftmaxSpec):
    """Softmax over each row in Triton, online across column blocks."""

    def run(
        self, inputs: Sequence[torch.Tensor], config: Config, shape: Shape, backend: str = "triton"
    ) -> torch.Tensor:
        """Softmax by the Triton kernel."""
        kernels, options = self.prepare_launch(inputs, config, backend)
        x = self.rows_of(inputs, shape)
        out = torch.empty_like(x)
        kernels.softmax(x, out, config["block_rows"], config["block_cols"], options)
        return out.view(inputs[0].shape)


SPEC = TritonSoftmaxSpec()
