"""``rms_norm``'s declaration: ``y = x / sqrt(mean(x^2, last dim) + eps) * w`` over a ``rows x cols`` matrix.

Tiling: the row-wise tiling of :mod:`tiletune.kernels.softmax.declaration`
(:class:`~tiletune.kernels.softmax.declaration.RowKernelDeclaration`). With whole-row tiles
(``tile_cols == cols``) a row tile is one step and the weight ``w`` is copied into local memory
once per call. With column tiles the first pass accumulates each row's sum of squares (float32)
across the column tiles; the second pass copies each column tile in again with its slice of ``w``
(a third input queue) and writes ``x * rsqrt(sum / cols + eps) * w``.

Default: as for every row-wise kernel (``total = rows * cols``;
``tile_cols = min(cols, E)``, ``tile_rows = E // tile_cols``, both snapped).

``eps`` is a call argument (any value, each call's own), not a dim: the key, the space and the best
tiling do not depend on it. Benches tune at the default, :data:`EPS`, the value the descriptions
name.
"""

from __future__ import annotations

from tiletune.kernels.declaration import FLOAT32_BYTES, Config, Shape, element_size, float32_copies
from tiletune.kernels.native.space import NativeDeclaration, with_block_dim
from tiletune.kernels.softmax.declaration import RowKernelDeclaration, TritonRowDeclaration, row_tiles

#: The default epsilon under the root: what ``torch.ops.tiletune.rms_norm`` (and its backward) computes
#: with when a call gives none, and what a bench tunes at; a call may give any other.
EPS = 1e-6


class RmsNormDeclaration(RowKernelDeclaration):
    """RMS normalisation of each row, scaled by a weight vector of length ``cols``."""

    name = "rms_norm"
    has_vendor = True
    backward_kernel = "rms_norm_backward"
    version = 1
    description = "y = x / sqrt(mean(x^2) + 1e-6) * w over each row of a rows x cols matrix"

    def _state_bytes(self, config: Config, shape: Shape, dtype: str) -> int:
        """Sum of squares per row (float32, running and block), the weight, low-precision scratch."""
        whole_rows = config["tile_cols"] >= shape["cols"]
        weight = shape["cols"] if whole_rows else config["buffer_num"] * config["tile_cols"]
        stats = 2 * config["tile_rows"] * FLOAT32_BYTES
        return stats + weight * element_size(dtype) + self._scratch_bytes(config, dtype)

    def tensor_bytes(self, shape: Shape, dtype: str) -> dict[str, int]:
        """``x`` and ``out`` (``rows x cols``), and the weight ``w`` (``cols``)."""
        return {**super().tensor_bytes(shape, dtype), "w": shape["cols"] * element_size(dtype)}

    def workspace_bytes(self, shape: Shape, dtype: str) -> dict[str, int]:
        """The reference's float32 result and one float32 intermediate (``rows x cols`` each), and its
        float32 copies of ``x`` and ``w`` (low precision)."""
        rows, cols = shape["rows"], shape["cols"]
        return {
            **float32_copies(dtype, x=rows * cols, w=cols),
            "reference": rows * cols * FLOAT32_BYTES,
            "reference_scratch": rows * cols * FLOAT32_BYTES,
        }


class NativeRmsNormDeclaration(NativeDeclaration, RmsNormDeclaration):
    """``native_rms_norm``: ``rms_norm``'s row tiles spread over ``block_dim`` cores
    (``kernels/native/csrc/rows.cpp``)."""

    name = "native_rms_norm"
    backward_kernel = "native_rms_norm_backward"
    version = 1
    description = "y = x / sqrt(mean(x^2) + 1e-6) * w, native CPU: row tiles over block_dim cores"
    portable = RmsNormDeclaration
    knobs = with_block_dim(RowKernelDeclaration.knobs)

    def tile_count(self, config: Config, shape: Shape) -> int:
        """Row tiles."""
        return row_tiles(config, shape)


class TritonRmsNormDeclaration(TritonRowDeclaration, RmsNormDeclaration):
    """``triton_rms_norm``: RMS normalisation of each row in Triton, two passes when a row spans
    blocks (see ``kernels/rms_norm/triton.py``)."""

    name = "triton_rms_norm"
    backward_kernel = "triton_rms_norm_backward"
    version = 1
    description = "rms_norm in Triton: block_rows rows per program, two passes when a row spans blocks"

    def _state_bytes(self, config: Config, shape: Shape, dtype: str) -> int:
        """The slice of ``w`` loaded with each block."""
        return config["block_cols"] * element_size(dtype) * config["num_stages"]
