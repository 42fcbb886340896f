"""``softmax_backward``'s declaration: the gradient of ``softmax`` over the last dim of a ``rows x cols``
matrix, from the forward's output.

Math: with ``y = softmax(x)`` (the forward's output, saved) and ``g`` the gradient of ``y``, each row's
gradient of ``x`` is ``dx = y * (g - s)``, ``s = sum(g * y)`` over the row (a float32 statistic).
Inputs ``(y, grad)``, both ``rows x cols``; one output, ``dx``, shaped like ``y`` in ``y``'s dtype.
The keys carry the forward's dims (``rows``, ``cols``), so a shape of ``softmax`` names the same call
of its backward.

Tiling: the row-wise tiling of :class:`~tiletune.kernels.softmax.declaration.RowKernelDeclaration`,
tiles ``tile_rows x tile_cols``. When ``tile_cols == cols`` a row tile is one step: copy-in of ``y``
and ``g``, the row sums ``s`` and ``dx`` on the local tiles, copy-out. When ``tile_cols < cols`` a
row tile takes two passes over its column tiles (each step copies both column tiles in again): a
first pass that only accumulates ``s`` per row, and a second pass that produces and copies out each
column tile of ``dx``.

Queues: two input queues (``y``, ``g``) and the output queue (``dx``), ``buffer_num`` tiles each; the
per-row statistic, running and per tile, is float32; for float16/bfloat16 the compute stage works in
float32 scratch (two tiles: ``y``'s and ``g``'s, ``dx`` computed over ``g``'s). All of it counts in
the working set. There is no weight and no reduction over rows (``softmax`` has no parameter).

Default (the hand-written rule, as the forward's, ``total = rows * cols``):
``heuristic_tiling(total, element size, local memory)`` gives tile elements ``E``;
``tile_cols = min(cols, E)`` snapped down, ``tile_rows = max(1, E // tile_cols)`` snapped down;
buffers and depth as the rule says.

The native kernel spreads the row tiles over ``block_dim`` cores; the Triton kernel owns
``block_rows`` rows per program, walked in ``block_cols`` column blocks, its working set the ``y``
and ``g`` blocks of every stage in flight (see :mod:`tiletune.kernels.softmax_backward.triton`).
"""

from __future__ import annotations

from tiletune.client.space import DeviceLimits
from tiletune.kernels.declaration import FLOAT32_BYTES, Config, Shape, element_size, float32_copies
from tiletune.kernels.native.space import NativeDeclaration, with_block_dim
from tiletune.kernels.softmax.declaration import RowKernelDeclaration, TritonRowDeclaration, row_tiles

#: Input queues: ``y`` and ``g``.
INPUT_QUEUES = 2


class SoftmaxBackwardDeclaration(RowKernelDeclaration):
    """``dx = y * (g - sum(g * y))`` over each row, two passes across column tiles."""

    name = "softmax_backward"
    has_vendor = True
    version = 1
    description = (
        "softmax's gradient dx = y * (g - sum(g * y)) over the last dim of rows x cols, "
        "from the forward's output y (two passes across column tiles)"
    )

    def working_set_bytes(self, config: Config, shape: Shape, dtype: str) -> int:
        """Two input queues and the output queue of ``buffer_num`` tiles, plus the kernel's state."""
        tile = config["tile_rows"] * config["tile_cols"]
        queues = (INPUT_QUEUES + 1) * config["buffer_num"] * tile * element_size(dtype)
        return queues + self._state_bytes(config, shape, dtype)

    def _state_bytes(self, config: Config, shape: Shape, dtype: str) -> int:
        """The row sum ``s`` per row (float32, running and per tile), plus low-precision scratch."""
        return 2 * config["tile_rows"] * FLOAT32_BYTES + self._scratch_bytes(config, dtype)

    def flops(self, shape: Shape) -> float:
        """Four operations per element: ``g * y`` and its sum, ``g - s``, times ``y``."""
        return 4.0 * shape["rows"] * shape["cols"]

    def bytes_moved(self, shape: Shape, dtype: str) -> float:
        """Read ``y`` and ``g`` once, write ``dx`` once."""
        return 3.0 * shape["rows"] * shape["cols"] * element_size(dtype)

    def tensor_bytes(self, shape: Shape, dtype: str) -> dict[str, int]:
        """``y``, ``grad`` and ``dx``: ``rows x cols`` each."""
        size = shape["rows"] * shape["cols"] * element_size(dtype)
        return {"y": size, "grad": size, "dx": size}

    def workspace_bytes(self, shape: Shape, dtype: str) -> dict[str, int]:
        """The reference's float32 result and one float32 intermediate (``g - s``), and its float32
        copies of ``y`` and ``grad`` (low precision)."""
        elements = shape["rows"] * shape["cols"]
        return {
            **float32_copies(dtype, y=elements, grad=elements),
            "reference": elements * FLOAT32_BYTES,
            "reference_scratch": elements * FLOAT32_BYTES,
        }


class NativeSoftmaxBackwardDeclaration(NativeDeclaration, SoftmaxBackwardDeclaration):
    """``native_softmax_backward``: ``softmax_backward``'s row tiles spread over ``block_dim`` cores
    (``kernels/native/csrc/softmax_backward.cpp``)."""

    name = "native_softmax_backward"
    version = 1
    description = "softmax's gradient over the last dim, native CPU: row tiles over block_dim cores"
    portable = SoftmaxBackwardDeclaration
    knobs = with_block_dim(RowKernelDeclaration.knobs)

    def tile_count(self, config: Config, shape: Shape) -> int:
        """Row tiles."""
        return row_tiles(config, shape)

    def invalid_reason(self, config: Config, shape: Shape, dtype: str, limits: DeviceLimits) -> str | None:
        """Whole-row tiles are read in place (no slots: a copy measured 10-20 % slower), so their
        ``buffer_num`` is only what the pipeline rule needs (1 at depth 1, else 2): the others would be
        the same run twice. Then the native and row rules."""
        if config["tile_cols"] >= shape["cols"]:
            needed = 1 if config["pipeline_depth"] == 1 else 2
            if config["buffer_num"] != needed:
                return (
                    f"whole-row tiles are read in place: buffer_num={config['buffer_num']} runs as "
                    f"buffer_num={needed} at pipeline_depth={config['pipeline_depth']}"
                )
        return super().invalid_reason(config, shape, dtype, limits)


class TritonSoftmaxBackwardDeclaration(TritonRowDeclaration, SoftmaxBackwardDeclaration):
    """``triton_softmax_backward``: softmax's gradient of each row in Triton, two passes when a row
    spans blocks (see ``kernels/softmax_backward/triton.py``)."""

    name = "triton_softmax_backward"
    version = 1
    description = "softmax_backward in Triton: block_rows rows per program, two passes across column blocks"

    def _state_bytes(self, config: Config, shape: Shape, dtype: str) -> int:
        """The ``g`` block loaded beside each ``y`` block (the row sums live in registers)."""
        return config["block_rows"] * config["block_cols"] * element_size(dtype) * config["num_stages"]
