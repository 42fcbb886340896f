"""``triton_add``: the ``add`` kernel (``out = a + b`` over ``n`` elements) in Triton.

Dims, inputs, reference and counts are ``add``'s. A program streams
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

from tiletune.client.space import pow2_ceil, snap_down
from tiletune.kernels.add import AddSpec
from tiletune.kernels.spec import Config, DeviceLimits, Shape, element_size, heuristic_tiling
from tiletune.kernels.triton_spec import NUM_STAGES, NUM_WARPS, TritonSpec, block_knob

BLOCK_SIZES = tuple(1 << p for p in range(4, 15))
#: Consecutive blocks one program streams through its pipelined loop.
TILES_PER_PROGRAM = 4


class TritonAddSpec(TritonSpec, AddSpec):
    """Elementwise ``a + b`` in Triton: 4 blocks per program, pipelined."""

    name = "triton_add"
    version = 1
    description = "add in Triton: a + b over n elements, 4 pipelined blocks per program"
    knobs = (
        block_knob("block_size", BLOCK_SIZES, "elements per block (a power of two)", clamp_to="n"),
        NUM_STAGES,
        NUM_WARPS,
    )

    def working_set_bytes(self, config: Config, shape: Shape, dtype: str) -> int:
        """The ``a`` and ``b`` blocks of every stage in flight."""
        return 2 * config["block_size"] * element_size(dtype) * config["num_stages"]

    def loop_steps(self, config: Config, shape: Shape) -> int:
        """Every program loops over its 4 blocks."""
        return TILES_PER_PROGRAM

    def default_config(self, shape: Shape, dtype: str, limits: DeviceLimits) -> Config:
        """The rule's tile elements as ``block_size`` (snapped), its depth as ``num_stages``."""
        rule = heuristic_tiling(shape["n"], element_size(dtype), limits.local_memory_bytes)
        blocks = self.knob_values(shape)["block_size"]
        block = pow2_ceil(shape["n"]) if shape["n"] <= 1024 else rule.tile_elements
        return {
            "block_size": snap_down(block, blocks),
            **self.launch_defaults(rule, TILES_PER_PROGRAM, limits),
        }

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
