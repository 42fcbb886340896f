"""``rms_norm_backward``'s declaration: the gradients of ``y = x * r * w`` over a ``rows x cols`` matrix.

Math: with ``r = rsqrt(mean(x^2) + eps)`` per row and ``x̂ = x r``, for the output's gradient ``g``:
``dx = r * (g w - x̂ * mean(g w x̂))`` (shaped like ``x``, in its dtype) and
``dw = sum over rows of g x̂`` (``cols``, in ``w``'s dtype). Per row the kernel needs two statistics,
``sum(x^2)`` and ``sum(g w x)`` (float32), and writes
``dx = r g w - x * (r^3 sum(g w x) / cols)``. Inputs ``(x, w, grad)``, outputs the tuple ``(dx, dw)``.
The keys carry the forward's dims (``rows``, ``cols``).

Tiling: the row-wise tiling of :class:`~tiletune.kernels.softmax.declaration.RowKernelDeclaration`.
With whole-row tiles (``tile_cols == cols``) a row tile is one step (``x`` and ``grad`` copied in,
the statistics, then ``dx``) and ``w`` is copied into local memory once per call. With column tiles
the first pass copies each column tile of ``x`` and ``grad`` in with its slice of ``w`` (a third
input queue) and accumulates both statistics across the column tiles; the second pass copies them
in again and produces each column tile of ``dx``. ``dw`` is accumulated in float32 by each core
(native: each of ``block_dim`` cores keeps ``cols`` partial sums over its rows; Triton: each
program over its row blocks), and the partial sums are then added in a fixed order: deterministic
for a given config.

Default: as for every row-wise kernel (``total = rows * cols``;
``tile_cols = min(cols, E)``, ``tile_rows = E // tile_cols``, both snapped).
"""

from __future__ import annotations

from tiletune.kernels.declaration import FLOAT32_BYTES, Config, Shape, element_size, float32_copies
from tiletune.kernels.native.space import NativeDeclaration, with_block_dim
from tiletune.kernels.softmax.declaration import RowKernelDeclaration, TritonRowDeclaration, row_tiles

#: The float32 per-row statistics a row tile keeps: ``sum(x^2)`` and ``sum(g w x)``, each running and
#: per block.
STATISTICS = 4


class RmsNormBackwardDeclaration(RowKernelDeclaration):
    """The gradients ``(dx, dw)`` of ``rms_norm`` for the output's gradient ``grad``."""

    name = "rms_norm_backward"
    has_vendor = True
    version = 1
    description = (
        "rms_norm's gradients (dx, dw) over each row of a rows x cols matrix (two row statistics; "
        "dw summed over rows in float32)"
    )

    def working_set_bytes(self, config: Config, shape: Shape, dtype: str) -> int:
        """Input queues of ``x`` and ``grad`` and the output queue of ``dx`` (``buffer_num`` tiles
        each), plus the kernel's state (:meth:`_state_bytes`)."""
        tile = config["tile_rows"] * config["tile_cols"]
        queues = 3 * config["buffer_num"] * tile * element_size(dtype)
        return queues + self._state_bytes(config, shape, dtype)

    def _state_bytes(self, config: Config, shape: Shape, dtype: str) -> int:
        """The weight (whole, or ``buffer_num`` column slices), the float32 row statistics, the float32
        scratch tiles, and the core's float32 ``dw`` partial sums (``cols``) with one column tile's
        block of them."""
        cols, tile_cols = shape["cols"], config["tile_cols"]
        weight = cols if tile_cols >= cols else config["buffer_num"] * tile_cols
        stats = STATISTICS * config["tile_rows"] * FLOAT32_BYTES
        dw = (cols + tile_cols) * FLOAT32_BYTES
        return weight * element_size(dtype) + stats + self._scratch_bytes(config, dtype) + dw

    def _scratch_bytes(self, config: Config, dtype: str) -> int:
        """One float32 tile of products; for float16/bfloat16 also float32 copies of the ``x`` and
        ``grad`` tiles and of the ``dx`` tile."""
        tiles = 1 if element_size(dtype) >= FLOAT32_BYTES else 4
        return tiles * config["tile_rows"] * config["tile_cols"] * FLOAT32_BYTES

    def flops(self, shape: Shape) -> float:
        """About twelve operations per element (the two statistics, ``dx``, ``dw``'s products and sum)."""
        return 12.0 * shape["rows"] * shape["cols"]

    def bytes_moved(self, shape: Shape, dtype: str) -> float:
        """Read ``x`` and ``grad`` once and write ``dx``; read ``w`` and write ``dw``."""
        rows, cols = shape["rows"], shape["cols"]
        return float((3 * rows * cols + 2 * cols) * element_size(dtype))

    def tensor_bytes(self, shape: Shape, dtype: str) -> dict[str, int]:
        """``x``, ``grad`` and ``dx`` (``rows x cols``), ``w`` and ``dw`` (``cols``)."""
        matrix = shape["rows"] * shape["cols"] * element_size(dtype)
        vector = shape["cols"] * element_size(dtype)
        return {"x": matrix, "w": vector, "grad": matrix, "dx": matrix, "dw": vector}

    def workspace_bytes(self, shape: Shape, dtype: str) -> dict[str, int]:
        """The reference's float32 results (``dx`` and ``dw``), its three float32 intermediates of
        ``rows x cols`` held at once (``x̂``, ``g w``, a product), and its float32 copies of the
        inputs (low precision)."""
        rows, cols = shape["rows"], shape["cols"]
        return {
            **float32_copies(dtype, x=rows * cols, w=cols, grad=rows * cols),
            "reference": (rows * cols + cols) * FLOAT32_BYTES,
            "reference_scratch": 3 * rows * cols * FLOAT32_BYTES,
        }


class NativeRmsNormBackwardDeclaration(NativeDeclaration, RmsNormBackwardDeclaration):
    """``native_rms_norm_backward``: ``rms_norm_backward``'s row tiles spread over ``block_dim`` cores
    (``kernels/native/csrc/rms_norm_backward.cpp``), each core's ``dw`` partial sums added at the end."""

    name = "native_rms_norm_backward"
    version = 1
    description = "rms_norm's gradients (dx, dw), native CPU: row tiles over block_dim cores"
    portable = RmsNormBackwardDeclaration
    knobs = with_block_dim(RowKernelDeclaration.knobs)

    def tile_count(self, config: Config, shape: Shape) -> int:
        """Row tiles."""
        return row_tiles(config, shape)


class TritonRmsNormBackwardDeclaration(TritonRowDeclaration, RmsNormBackwardDeclaration):
    """``triton_rms_norm_backward``: rms_norm's gradients in Triton, two passes when a row spans
    blocks (see ``kernels/rms_norm_backward/triton.py``)."""

    name = "triton_rms_norm_backward"
    version = 1
    description = (
        "rms_norm's gradients in Triton: block_rows rows per step, two passes when a row spans blocks, "
        "dw partial sums per program"
    )

    def working_set_bytes(self, config: Config, shape: Shape, dtype: str) -> int:
        """The ``x`` and ``grad`` blocks and the ``w`` slice of every stage in flight, and the
        program's float32 ``dw`` sums of one column block:
        ``(2 * block_rows + 1) * block_cols * element size * num_stages + block_cols * 4``."""
        block_rows, block_cols = config["block_rows"], config["block_cols"]
        blocks = (2 * block_rows + 1) * block_cols * element_size(dtype) * config["num_stages"]
        return blocks + block_cols * FLOAT32_BYTES
