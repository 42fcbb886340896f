"""``ascendc_add_tiles``'s space (torch-free, what a server reads): two build-time knobs and one run-time.

- ``tile_length`` and ``buffer_num`` are compile-time constants of the Ascend C kernel
  (``csrc/add_tiles.cpp``): :attr:`build_knobs`, one ``bisheng`` build per combination;
- ``block_dim``, the AI cores of the launch (``<<<blockDim, …>>>``), is passed at run time.

Constraints: a tile is whole 32-byte blocks (``DataCopy``'s unit), the three queues' slots fit the
unified buffer (``3 * buffer_num * tile_length * 2`` bytes), and ``n`` is a multiple of
``block_dim * tile_length`` (the kernel has no tail handling).
"""

from __future__ import annotations

from tiletune.client.space import DeviceLimits, Dim, Knob
from tiletune.kernels.declaration import Config, KernelDeclaration, Shape

HALF_BYTES = 2


class AddTilesDeclaration(KernelDeclaration):
    """z = x + y in float16 on the AI cores' vector units, tiles fixed at build time."""

    name = "ascendc_add_tiles"
    version = 1
    description = "z = x + y (Ascend C, float16): tile_length and buffer_num are compile-time constants"
    dims = (Dim("n", "elements"),)
    knobs = (
        Knob(
            "tile_length", (256, 512, 1024, 2048, 4096, 8192), "elements per tile (a constant of the build)"
        ),
        Knob("buffer_num", (1, 2), "slots per queue, 2 = double buffering (a constant of the build)"),
        Knob("block_dim", (1, 2, 4, 8, 16, 20, 40), "AI cores of the launch (run time)"),
    )
    implementations = ("ascendc",)
    build_knobs = ("tile_length", "buffer_num")

    def working_set_bytes(self, config: Config, shape: Shape, dtype: str) -> int:
        """Three queues (x, y in; z out) of ``buffer_num`` tiles of float16."""
        return 3 * config["buffer_num"] * config["tile_length"] * HALF_BYTES

    def invalid_reason(self, config: Config, shape: Shape, dtype: str, limits: DeviceLimits) -> str | None:
        """float16 only; ``n`` split evenly into whole tiles per core; then the base rules (UB)."""
        if dtype != "float16":
            return "the kernel is built for float16"
        if (config["tile_length"] * HALF_BYTES) % limits.alignment_bytes:
            return f"a tile must be whole {limits.alignment_bytes}-byte blocks"
        if shape["n"] % (config["block_dim"] * config["tile_length"]):
            return "n must be a multiple of block_dim * tile_length (the kernel has no tail)"
        return super().invalid_reason(config, shape, dtype, limits)

    def default_config(self, shape: Shape, dtype: str, limits: DeviceLimits) -> Config:
        """The samples' hand-written choice: 8 cores, double buffering, tiles of 2048 (or what divides)."""
        for tile in (2048, 1024, 512, 256):
            if shape["n"] % (8 * tile) == 0:
                return {"tile_length": tile, "buffer_num": 2, "block_dim": 8}
        return {"tile_length": 256, "buffer_num": 2, "block_dim": 1}

    def flops(self, shape: Shape) -> float:
        """One add per element."""
        return float(shape["n"])

    def bytes_moved(self, shape: Shape, dtype: str) -> float:
        """Read x and y, write z."""
        return 3.0 * shape["n"] * HALF_BYTES


ADD_TILES = AddTilesDeclaration()
