"""``add``'s declaration: ``out = a + b`` over ``n`` elements, the Ascend C hello-world.

Tiling: ``n`` is cut into tiles of ``tile_size`` elements (the last one may
be shorter). Per tile: copy-in of ``a`` and ``b`` into their input slots,
``out_slot = a_slot + b_slot``, copy-out. Three queues (``a``, ``b``, ``out``)
of ``buffer_num`` slots each: working set ``3 * buffer_num * tile_size *
element size``.

Default (the hand-written rule): ``heuristic_tiling(n, element size, local
memory)``; ``tile_size`` = the rule's tile elements snapped down to the knob
values for the shape (``n`` itself when ``n <= 1024``: one tile), buffers and
depth as the rule says.
"""

from __future__ import annotations

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

TILE_SIZES = tuple(1 << p for p in range(8, 23))
#: ``triton_add``'s block sizes.
BLOCK_SIZES = tuple(1 << p for p in range(4, 15))
#: Consecutive blocks one ``triton_add`` program streams through its pipelined loop.
TILES_PER_PROGRAM = 4


class AddDeclaration(KernelDeclaration):
    """Elementwise ``a + b`` tiled over one dim."""

    name = "add"
    has_vendor = True
    version = 1
    description = "elementwise a + b over n elements (the Ascend C hello-world)"
    dims = (Dim("n", "number of elements"),)
    knobs: tuple[Knob, ...] = (
        Knob("tile_size", TILE_SIZES, "elements per tile", clamp_to="n"),
        BUFFER_NUM,
        PIPELINE_DEPTH,
    )
    implementations: tuple[str, ...] = PORTABLE_AND_NATIVE

    def working_set_bytes(self, config: Config, shape: Shape, dtype: str) -> int:
        """Three queues (a, b, out) of ``buffer_num`` tiles each."""
        return 3 * config["buffer_num"] * config["tile_size"] * element_size(dtype)

    def default_config(self, shape: Shape, dtype: str, limits: DeviceLimits) -> Config:
        """The rule's tile elements as ``tile_size`` (snapped), its buffers and depth."""
        rule = heuristic_tiling(shape["n"], element_size(dtype), limits.local_memory_bytes)
        tiles = self.knob_values(shape)["tile_size"]
        return {
            "tile_size": snap_down(rule.tile_elements, tiles),
            "buffer_num": rule.buffer_num,
            "pipeline_depth": rule.pipeline_depth,
        }

    def flops(self, shape: Shape) -> float:
        """One add per element."""
        return float(shape["n"])

    def bytes_moved(self, shape: Shape, dtype: str) -> float:
        """Read ``a`` and ``b``, write ``out``."""
        return 3.0 * shape["n"] * element_size(dtype)

    def tensor_bytes(self, shape: Shape, dtype: str) -> dict[str, int]:
        """``a``, ``b`` and ``out``: ``n`` elements each."""
        size = shape["n"] * element_size(dtype)
        return {"a": size, "b": size, "out": size}

    def workspace_bytes(self, shape: Shape, dtype: str) -> dict[str, int]:
        """The reference's float32 result, and its float32 copies of ``a`` and ``b`` (low precision)."""
        n = shape["n"]
        return {**float32_copies(dtype, a=n, b=n), "reference": n * FLOAT32_BYTES}


class NativeAddDeclaration(NativeDeclaration, AddDeclaration):
    """``native_add``: ``add``'s tiles spread over ``block_dim`` cores (``kernels/native/csrc/add.cpp``)."""

    name = "native_add"
    version = 1
    description = "elementwise a + b, native CPU: tiles over block_dim cores, buffered copy-in/out"
    portable = AddDeclaration
    knobs = with_block_dim(AddDeclaration.knobs)

    def tile_count(self, config: Config, shape: Shape) -> int:
        """``ceil(n / tile_size)``."""
        return -(-shape["n"] // config["tile_size"])


class TritonAddDeclaration(TritonDeclaration, AddDeclaration):
    """``triton_add``: 4 blocks of ``block_size`` per program, pipelined (see ``kernels/add/triton.py``)."""

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
