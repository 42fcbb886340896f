"""``softmax``'s declaration, and the row-wise tiling it shares with ``rms_norm``.

``softmax`` runs over the last dim of a ``rows x cols`` matrix.

Tiling (shared with ``rms_norm`` through :class:`RowKernelDeclaration`): a tile is
``tile_rows x tile_cols``. When ``tile_cols == cols`` a row tile is one step:
copy-in, the whole-row op on the local tile, copy-out. When ``tile_cols <
cols`` a row tile takes two passes over its column tiles (each step copies
its column tile in again): a first pass that only accumulates per-row
statistics, and a second pass that produces and copies out each column tile.

Queues: input and output tiles, ``buffer_num`` slots each; the per-row
statistics are float32 accumulators; for float16/bfloat16 the compute stage
works in float32 scratch (two tiles). All of it counts in the working set.

Default (the hand-written rule, ``total = rows * cols``):
``heuristic_tiling(total, element size, local memory)`` gives tile elements
``E``; ``tile_cols = min(cols, E)`` snapped down to the knob values,
``tile_rows = max(1, E // tile_cols)`` snapped down; buffers and depth as the
rule says. For ``total <= 1024`` that is one tile of the whole matrix.

The native kernels spread the row tiles over ``block_dim`` cores; the Triton kernels
(:class:`TritonRowDeclaration`) own ``block_rows`` rows per program, walked in ``block_cols``
column blocks (see :mod:`tiletune.kernels.softmax.triton`).
"""

from __future__ import annotations

from abc import abstractmethod

from tiletune.client.space import DeviceLimits, Dim, Knob, pow2_ceil, snap_down
from tiletune.kernels.declaration import (
    BUFFER_NUM,
    FLOAT32_BYTES,
    PIPELINE_DEPTH,
    Config,
    KernelDeclaration,
    Shape,
    element_size,
    float32_copies,
    heuristic_tiling,
)
from tiletune.kernels.native.space import PORTABLE_AND_NATIVE, NativeDeclaration, with_block_dim
from tiletune.kernels.triton.space import NUM_STAGES, NUM_WARPS, TritonDeclaration, block_knob

TILE_ROWS = tuple(1 << p for p in range(11))
TILE_COLS = tuple(1 << p for p in range(5, 15))
#: The Triton row-wise kernels' block sizes.
BLOCK_ROWS = tuple(1 << p for p in range(8))
BLOCK_COLS = tuple(1 << p for p in range(4, 15))


def row_tiles(config: Config, shape: Shape) -> int:
    """``ceil(rows / tile_rows)``: the tiles the cores of a row-wise kernel share."""
    return -(-shape["rows"] // config["tile_rows"])


class RowKernelDeclaration(KernelDeclaration):
    """A row-wise kernel over a ``rows x cols`` matrix, tiled ``tile_rows x tile_cols``.

    Subclasses give the name and the per-row state in the working set
    (``_state_bytes``); their specs give ``run``.
    """

    dims = (Dim("rows", "independent rows"), Dim("cols", "elements per row (the reduced dim)"))
    knobs: tuple[Knob, ...] = (
        Knob("tile_rows", TILE_ROWS, "rows per tile", clamp_to="rows"),
        Knob(
            "tile_cols", TILE_COLS, "columns per tile (< cols: two passes over column tiles)", clamp_to="cols"
        ),
        BUFFER_NUM,
        PIPELINE_DEPTH,
    )
    implementations: tuple[str, ...] = PORTABLE_AND_NATIVE

    @abstractmethod
    def _state_bytes(self, config: Config, shape: Shape, dtype: str) -> int:
        """Working set beyond the input and output queues (statistics, scratch, weights)."""

    def working_set_bytes(self, config: Config, shape: Shape, dtype: str) -> int:
        """Input and output queues of ``buffer_num`` tiles, plus the kernel's state."""
        tile = config["tile_rows"] * config["tile_cols"]
        queues = 2 * config["buffer_num"] * tile * element_size(dtype)
        return queues + self._state_bytes(config, shape, dtype)

    def _scratch_bytes(self, config: Config, dtype: str) -> int:
        """Two float32 tiles of compute scratch for float16/bfloat16, none for float32."""
        if element_size(dtype) >= FLOAT32_BYTES:
            return 0
        return 2 * config["tile_rows"] * config["tile_cols"] * FLOAT32_BYTES

    def default_config(self, shape: Shape, dtype: str, limits: DeviceLimits) -> Config:
        """The rule's tile elements as whole rows where they fit, else one row's column tile."""
        rows, cols = shape["rows"], shape["cols"]
        rule = heuristic_tiling(rows * cols, element_size(dtype), limits.local_memory_bytes)
        values = self.knob_values(shape)
        tile_cols = snap_down(min(cols, rule.tile_elements), values["tile_cols"])
        tile_rows = snap_down(max(1, rule.tile_elements // tile_cols), values["tile_rows"])
        return {
            "tile_rows": tile_rows,
            "tile_cols": tile_cols,
            "buffer_num": rule.buffer_num,
            "pipeline_depth": rule.pipeline_depth,
        }

    def flops(self, shape: Shape) -> float:
        """About five operations per element."""
        return 5.0 * shape["rows"] * shape["cols"]

    def bytes_moved(self, shape: Shape, dtype: str) -> float:
        """Read ``x`` once, write the result once."""
        return 2.0 * shape["rows"] * shape["cols"] * element_size(dtype)

    def tensor_bytes(self, shape: Shape, dtype: str) -> dict[str, int]:
        """``x`` and ``out``: ``rows x cols`` each."""
        size = shape["rows"] * shape["cols"] * element_size(dtype)
        return {"x": size, "out": size}

    def workspace_bytes(self, shape: Shape, dtype: str) -> dict[str, int]:
        """The reference's float32 result, and its float32 copy of ``x`` (low precision)."""
        elements = shape["rows"] * shape["cols"]
        return {**float32_copies(dtype, x=elements), "reference": elements * FLOAT32_BYTES}


class SoftmaxDeclaration(RowKernelDeclaration):
    """Softmax over each row, with online softmax across column tiles."""

    name = "softmax"
    has_vendor = True
    backward_kernel = "softmax_backward"
    version = 1
    description = "softmax over the last dim of a rows x cols matrix (online across column tiles)"

    def _state_bytes(self, config: Config, shape: Shape, dtype: str) -> int:
        """Running and block log-sum-exp per row (float32), plus low-precision scratch."""
        return 2 * config["tile_rows"] * FLOAT32_BYTES + self._scratch_bytes(config, dtype)


class NativeSoftmaxDeclaration(NativeDeclaration, SoftmaxDeclaration):
    """``native_softmax``: ``softmax``'s row tiles spread over ``block_dim`` cores
    (``kernels/native/csrc/rows.cpp``)."""

    name = "native_softmax"
    backward_kernel = "native_softmax_backward"
    version = 1
    description = "softmax over the last dim, native CPU: row tiles over block_dim cores"
    portable = SoftmaxDeclaration
    knobs = with_block_dim(RowKernelDeclaration.knobs)

    def tile_count(self, config: Config, shape: Shape) -> int:
        """Row tiles."""
        return row_tiles(config, shape)


class TritonRowDeclaration(TritonDeclaration, RowKernelDeclaration):
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


class TritonSoftmaxDeclaration(TritonRowDeclaration, SoftmaxDeclaration):
    """``triton_softmax``: softmax over each row in Triton, online across column blocks
    (see ``kernels/softmax/triton.py``)."""

    name = "triton_softmax"
    backward_kernel = "triton_softmax_backward"
    version = 1
    description = "softmax in Triton: block_rows rows per program, online softmax across column blocks"
