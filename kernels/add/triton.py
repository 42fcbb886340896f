"""``triton_add``: the ``add`` kernel (``out = a + b`` over ``n`` elements) in Triton.

Its declaration (knobs, working set, default) is
:class:`~tiletune.kernels.add.declaration.TritonAddDeclaration`;
inputs and reference are ``add``'s. A program streams
``TILES_PER_PROGRAM`` (4) consecutive blocks of ``block_size`` elements
through a loop that ``num_stages`` pipelines; the grid covers ``n`` and the last
blocks are masked.

Working set: the ``a`` and ``b`` blocks in flight, ``2 * block_size * element
size * num_stages`` (the sum goes from registers straight to memory).

Default (the hand-written rule): ``heuristic_tiling(n, element size, local
memory)``; ``block_size`` = the rule's tile elements snapped down to the knob
values (for ``n <= 1024``, one tile of everything: the smallest power of two
covering ``n``); ``num_stages`` = the rule's pipeline depth and ``num_warps`` =
4 (see :meth:`TritonSpec.launch_defaults`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tiletune.kernels.add.declaration import TILES_PER_PROGRAM, TritonAddDeclaration
from tiletune.kernels.add.portable import AddSpec
from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.triton.spec import TritonSpec


class TritonAddSpec(TritonAddDeclaration, TritonSpec, AddSpec):
    """Elementwise ``a + b`` in Triton: 4 blocks per program, pipelined."""

    def run(
        self, inputs: Sequence[torch.Tensor], config: Config, shape: Shape, backend: str = "triton"
    ) -> torch.Tensor:
        """``a + b`` by the Triton kernel (flat; the caller's sizes are kept)."""
        kernels, options = self.prepare_launch(inputs, config, backend)
        a, b = (t.contiguous().view(-1) for t in inputs)
        out = torch.empty_like(a)
        kernels.add(a, b, out, (config["block_size"], TILES_PER_PROGRAM), options)
        return out.view(inputs[0].shape)


SPEC = TritonAddSpec()
