"""``triton_softmax``: ``softmax`` over the last dim of a ``rows x cols`` matrix, in Triton.

Dims, inputs, reference and counts are ``softmax``'s. Shared with
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

from tiletune.client.space import pow2_ceil, snap_down
from tiletune.kernels.softmax import RowKernelSpec, SoftmaxSpec
from tiletune.kernels.spec import Config, DeviceLimits, Shape, element_size, heuristic_tiling
from tiletune.kernels.triton_spec import NUM_STAGES, NUM_WARPS, TritonSpec, block_knob

BLOCK_ROWS = tuple(1 << p for p in range(8))
BLOCK_COLS = tuple(1 << p for p in range(4, 15))


class TritonRowSpec(TritonSpec, RowKernelSpec):
    """A row-wise Triton kernel: ``block_rows`` rows per program, ``block_cols`` columns per step."""

    knobs = (
        block_knob("block_rows", BLOCK_ROWS, "rows per program (a power of two)", clamp_to="rows"),
        block_knob(
            "block_cols",
            BLOCK_COLS,
            "columns per step (a power of two; below cols: two passes over column blocks)",
            clamp_to="cols",
        ),
        NUM_STAGES,
        NUM_WARPS,
    )

    def _state_bytes(self, config: Config, shape: Shape, dtype: str) -> int:
        """Nothing beyond the blocks: per-row statistics live in registers."""
        return 0

    def working_set_bytes(self, config: Config, shape: Shape, dtype: str) -> int:
        """The input block of every stage in flight, plus the kernel's own (``_state_bytes``)."""
        block = config["block_rows"] * config["block_cols"] * element_size(dtype) * config["num_stages"]
        return block + self._state_bytes(config, shape, dtype)

    def loop_steps(self, config: Config, shape: Shape) -> int:
        """Column blocks per pass; 1 when a block covers the row (one pass, no loop)."""
        return -(-shape["cols"] // config["block_cols"])

    def default_config(self, shape: Shape, dtype: str, limits: DeviceLimits) -> Config:
        """The rule's tile elements as whole rows where they fit, else one row's column block."""
        rows, cols = shape["rows"], shape["cols"]
        rule = heuristic_tiling(rows * cols, element_size(dtype), limits.local_memory_bytes)
        values = self.knob_values(shape)
        if rows * cols <= 1024:
            block_rows, block_cols = values["block_rows"][-1], values["block_cols"][-1]
        else:
            block_cols = pow2_ceil(cols) if cols <= rule.tile_elements else rule.tile_elements
            block_cols = snap_down(block_cols, values["block_cols"])
            block_rows = snap_down(max(1, rule.tile_elements // block_cols), values["block_rows"])
        config = {"block_rows": block_rows, "block_cols": block_cols}
        return {**config, **self.launch_defaults(rule, self.loop_steps(config, shape), limits)}

    def rows_of(self, inputs: Sequence[torch.Tensor], shape: Shape) -> torch.Tensor:
        """``x`` as a contiguous ``rows x cols`` matrix, whatever the caller's leading dims."""
        return inputs[0].reshape(-1, shape["cols"]).contiguous()


class TritonSoftmaxSpec(TritonRowSpec, SoftmaxSpec):
    """Softmax over each row in Triton, online across column blocks."""

    name = "triton_softmax"
    version = 1
    description = "softmax in Triton: block_rows rows per program, online softmax across column blocks"

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
