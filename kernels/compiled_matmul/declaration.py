"""``compiled_matmul``'s declaration: ``matmul`` with its tile sizes fixed at build time (torch-free).

The kernel is ``kernels/compiled_matmul/csrc/compiled_matmul.cpp``: its tiles ``tile_m``, ``tile_n``,
``tile_k`` are C++ template parameters (:attr:`~CompiledMatmulDeclaration.build_knobs`: each of their
combinations is a build, as in Ascend C, CATLASS or CUTLASS-style kernels); ``block_dim``, the
threads the output tiles are spread over, is passed at run time (configs differing in it alone share
a build). Dims, counts and the default rule are ``matmul``'s, its tiles spread over
``min(cores, tiles)`` threads; the knobs are ``native_matmul``'s without its buffers and pipeline
depth, so the two compare key for key.

Working set (float32 whatever the dtype: the kernel computes in float32): the packed B panel
``tile_k x tile_n``, the accumulator ``tile_m x tile_n`` and the A rows one slice reads
``tile_m x tile_k``, each row padded to whole 16-float vectors.
"""

from __future__ import annotations

from tiletune.client.space import Knob
from tiletune.kernels.declaration import FLOAT32_BYTES, Config, Shape
from tiletune.kernels.matmul.declaration import TILES, MatmulDeclaration
from tiletune.kernels.native.space import BLOCK_DIM, NativeDeclaration

#: The implementation's name: a build of the C++ kernel per config, loaded with ctypes.
COMPILED_BACKEND = "compiled"
#: Floats per vector of the kernel (its panel and accumulator rows are whole vectors).
VECTOR_FLOATS = 16


def _padded(columns: int) -> int:
    return -(-columns // VECTOR_FLOATS) * VECTOR_FLOATS


class CompiledMatmulDeclaration(NativeDeclaration, MatmulDeclaration):
    """``compiled_matmul``: output tiles over ``block_dim`` threads, tiles fixed at build time."""

    name = "compiled_matmul"
    #: Its configs are builds (build-ahead, the build cache): torch's op is not among them yet.
    has_vendor = False
    version = 1
    description = "C = A @ B, CPU: tile_m x tile_n x tile_k fixed at build time (a build per config)"
    portable = MatmulDeclaration
    knobs: tuple[Knob, ...] = (
        Knob("tile_m", TILES, "rows of an output tile (a template parameter)", clamp_to="m"),
        Knob("tile_n", TILES, "columns of an output tile (a template parameter)", clamp_to="n"),
        Knob("tile_k", TILES, "depth of one k slice (a template parameter)", clamp_to="k"),
        BLOCK_DIM,
    )
    build_knobs = ("tile_m", "tile_n", "tile_k")
    implementations = (COMPILED_BACKEND,)

    def tile_count(self, config: Config, shape: Shape) -> int:
        """Output tiles: ``ceil(m / tile_m) * ceil(n / tile_n)``."""
        return -(-shape["m"] // config["tile_m"]) * -(-shape["n"] // config["tile_n"])

    def working_set_bytes(self, config: Config, shape: Shape, dtype: str) -> int:
        """The B panel, the accumulator and the A rows of one slice, in float32, rows padded to vectors."""
        tm, tn, tk = config["tile_m"], config["tile_n"], config["tile_k"]
        return (tk * _padded(tn) + tm * _padded(tn) + tm * tk) * FLOAT32_BYTES

    def backward_keys(self, shape: Shape) -> list[tuple[str, Shape]]:
        """None: the gradients of a call are other kernels' business (this one is tuned, not trained)."""
        return []
