"""``matmul``'s declaration: ``C[m, n] = A[m, k] @ B[k, n]``, accumulated in float32.

Layout dims: ``a_transposed`` / ``b_transposed`` (0 or 1, default 0) say that an operand is read
in place as the transpose of a row-major matrix (``x.t()`` of a contiguous ``x``: a Linear
layer's weight, the backward's ``a.t()`` and ``b.t()``). Version 2 added them; keys without them
parse to 0 (both row-major).

Tiling: output tiles ``tile_m x tile_n`` in row-major order; each takes one
step per ``tile_k`` slice of ``k``. A step copies ``A[i, kk]`` and
``B[kk, j]`` into their input slots and accumulates their product into the
tile's float32 accumulator (one per output slot, like the cube unit's L0C);
copy-out converts the accumulator to the output dtype. For float16/bfloat16
the compute stage upcasts the two input tiles into float32 scratch first.

Working set: ``buffer_num * (tile_m*tile_k + tile_k*tile_n) * element size``
(input queues) ``+ buffer_num * tile_m*tile_n * 4`` (accumulators) ``+``
low-precision scratch.

Default (the hand-written rule, ``total = m * n``, the output elements):
``heuristic_tiling`` gives tile elements ``E``; ``tile_m``, ``tile_n`` and
``tile_k`` all take the square side ``pow2_floor(sqrt(E))``, each snapped
down to its knob values; buffers and depth as the rule says. For
``total <= 1024`` every tile knob takes its whole dim (``tile_k`` at most 512,
the largest knob value).
"""

from __future__ import annotations

import math

from tiletune.client.space import DeviceLimits, Dim, Knob, snap_down
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
    pow2_floor,
)
from tiletune.kernels.native.space import PORTABLE_AND_NATIVE, NativeDeclaration, with_block_dim
from tiletune.kernels.triton.space import NUM_STAGES, NUM_WARPS, TritonDeclaration, block_knob

TILES = tuple(1 << p for p in range(4, 10))
#: ``triton_matmul``'s ``block_m`` and ``block_n`` values.
BLOCK_MN = tuple(1 << p for p in range(4, 9))
#: ``triton_matmul``'s ``block_k`` values.
BLOCK_K = tuple(1 << p for p in range(4, 8))


class MatmulDeclaration(KernelDeclaration):
    """Tiled GEMM with a k loop per output tile."""

    name = "matmul"
    has_vendor = True
    version = 2
    description = "C = A @ B with A m x k and B k x n, float32 accumulation"
    dims = (
        Dim("m", "rows of A and C"),
        Dim("n", "columns of B and C"),
        Dim("k", "the reduced dim"),
        Dim(
            "a_transposed",
            "1: A is read as the transpose of a row-major [k, m] matrix (strides (1, m))",
            choices=(0, 1),
            default=0,
        ),
        Dim(
            "b_transposed",
            "1: B is read as the transpose of a row-major [n, k] matrix (strides (1, k))",
            choices=(0, 1),
            default=0,
        ),
    )
    knobs: tuple[Knob, ...] = (
        Knob("tile_m", TILES, "rows of an output tile", clamp_to="m"),
        Knob("tile_n", TILES, "columns of an output tile", clamp_to="n"),
        Knob("tile_k", TILES, "depth of one k step", clamp_to="k"),
        BUFFER_NUM,
        PIPELINE_DEPTH,
    )
    implementations: tuple[str, ...] = PORTABLE_AND_NATIVE

    def working_set_bytes(self, config: Config, shape: Shape, dtype: str) -> int:
        """Input queues for A and B tiles, float32 accumulators per output slot, low-precision scratch."""
        tm, tn, tk, buffers = (config[k] for k in ("tile_m", "tile_n", "tile_k", "buffer_num"))
        inputs = tm * tk + tk * tn
        scratch = 0 if dtype == "float32" else inputs * FLOAT32_BYTES
        return buffers * inputs * element_size(dtype) + buffers * tm * tn * FLOAT32_BYTES + scratch

    def default_config(self, shape: Shape, dtype: str, limits: DeviceLimits) -> Config:
        """Square tiles of the rule's tile elements (whole dims for tiny problems)."""
        rule = heuristic_tiling(shape["m"] * shape["n"], element_size(dtype), limits.local_memory_bytes)
        values = self.knob_values(shape)
        small = shape["m"] * shape["n"] <= 1024  # the rule's "one tile of everything"
        side = pow2_floor(math.sqrt(rule.tile_elements))
        tiles = {
            knob: snap_down(shape[dim] if small else side, values[knob])
            for knob, dim in (("tile_m", "m"), ("tile_n", "n"), ("tile_k", "k"))
        }
        return {**tiles, "buffer_num": rule.buffer_num, "pipeline_depth": rule.pipeline_depth}

    def backward_keys(self, shape: Shape) -> list[tuple[str, Shape]]:
        """Two calls of this kernel, on the transposes read in place: ``da = g @ b^T`` (``m x k`` over
        ``n``; ``b^T`` is a transposed view unless ``b`` already was one) and ``db = a^T @ g`` (``k x n``
        over ``m``), ``g`` the output's contiguous gradient."""
        m, n, k = shape["m"], shape["n"], shape["k"]
        a_t, b_t = shape.get("a_transposed", 0), shape.get("b_transposed", 0)
        da = {"m": m, "n": k, "k": n, "a_transposed": 0, "b_transposed": 1 - b_t}
        db = {"m": k, "n": n, "k": m, "a_transposed": 1 - a_t, "b_transposed": 0}
        return [(self.name, da), (self.name, db)]

    def flops(self, shape: Shape) -> float:
        """A multiply and an add per (m, n, k) triple."""
        return 2.0 * shape["m"] * shape["n"] * shape["k"]

    def bytes_moved(self, shape: Shape, dtype: str) -> float:
        """Read A and B once, write C once."""
        m, n, k = shape["m"], shape["n"], shape["k"]
        return float((m * k + k * n + m * n) * element_size(dtype))

    def tensor_bytes(self, shape: Shape, dtype: str) -> dict[str, int]:
        """``a`` (m x k), ``b`` (k x n) and ``out`` (m x n)."""
        m, n, k, size = shape["m"], shape["n"], shape["k"], element_size(dtype)
        return {"a": m * k * size, "b": k * n * size, "out": m * n * size}

    def workspace_bytes(self, shape: Shape, dtype: str) -> dict[str, int]:
        """The reference's float32 result (m x n), its float32 copies of ``a``, ``b`` (low precision)."""
        m, n, k = shape["m"], shape["n"], shape["k"]
        return {**float32_copies(dtype, a=m * k, b=k * n), "reference": m * n * FLOAT32_BYTES}


class NativeMatmulDeclaration(NativeDeclaration, MatmulDeclaration):
    """``native_matmul``: ``matmul``'s output tiles spread over ``block_dim`` cores, k blocks through
    ``sgemm_`` (``kernels/native/csrc/matmul.cpp``)."""

    name = "native_matmul"
    version = 2
    description = "C = A @ B, native CPU: output tiles over block_dim cores, k blocks through sgemm_"
    portable = MatmulDeclaration
    knobs = with_block_dim(MatmulDeclaration.knobs)

    def tile_count(self, config: Config, shape: Shape) -> int:
        """Output tiles: ``ceil(m / tile_m) * ceil(n / tile_n)``."""
        return -(-shape["m"] // config["tile_m"]) * -(-shape["n"] // config["tile_n"])


class TritonMatmulDeclaration(TritonDeclaration, MatmulDeclaration):
    """``triton_matmul``: one output tile per program, a pipelined k loop of ``tl.dot`` (see
    ``kernels/matmul/triton.py``)."""

    name = "triton_matmul"
    version = 2
    description = "matmul in Triton: block_m x block_n output tiles, pipelined k loop of tl.dot"
    knobs = (
        block_knob("block_m", BLOCK_MN, "rows of an output tile (a power of two, >= 16)", clamp_to="m"),
        block_knob("block_n", BLOCK_MN, "columns of an output tile (a power of two, >= 16)", clamp_to="n"),
        block_knob("block_k", BLOCK_K, "depth of one k step (a power of two, >= 16)", clamp_to="k"),
        NUM_STAGES,
        NUM_WARPS,
    )

    def working_set_bytes(self, config: Config, shape: Shape, dtype: str) -> int:
        """The A and B blocks of every stage in flight."""
        bm, bn, bk = config["block_m"], config["block_n"], config["block_k"]
        return (bm * bk + bk * bn) * element_size(dtype) * config["num_stages"]

    def loop_steps(self, config: Config, shape: Shape) -> int:
        """k steps per output tile."""
        return -(-shape["k"] // config["block_k"])

    def default_config(self, shape: Shape, dtype: str, limits: DeviceLimits) -> Config:
        """Square blocks of the rule's tile elements (whole dims for tiny problems)."""
        rule = heuristic_tiling(shape["m"] * shape["n"], element_size(dtype), limits.local_memory_bytes)
        values = self.knob_values(shape)
        small = shape["m"] * shape["n"] <= 1024  # the rule's "one tile of everything"
        side = pow2_floor(math.sqrt(rule.tile_elements))
        blocks = {
            knob: values[knob][-1] if small else snap_down(side, values[knob])
            for knob in ("block_m", "block_n", "block_k")
        }
        return {**blocks, **self.launch_defaults(rule, self.loop_steps(blocks, shape), limits)}
