"""The tiled tanh-GELU's declaration: its tuning space and counts, torch-free.

What a tiletune server reads (entry point ``tiletune.spaces``): the dim ``n``, the knob
``tile_size`` (elements per tile, clamped to ``n``), the working set (one input and one output
tile), the default (tiletune's hand-written rule mapped onto the knob), and the bytes of its
tensors. The server imports this module without torch; the implementation is ``spec.py``.
"""

from __future__ import annotations

from tiletune.client.space import DeviceLimits, Dim, Knob, snap_down
from tiletune.kernels.declaration import Config, KernelDeclaration, Shape, element_size, heuristic_tiling


class GeluDeclaration(KernelDeclaration):
    """``y = gelu(x, approximate="tanh")`` over a flat tensor, tile by tile."""

    name = "gelu"
    version = 1
    description = "tanh-approximated GELU, tiled over a flat tensor (example plugin)"
    dims = (Dim("n", "number of elements"),)
    knobs = (Knob("tile_size", tuple(1 << p for p in range(8, 23)), "elements per tile", clamp_to="n"),)

    def working_set_bytes(self, config: Config, shape: Shape, dtype: str) -> int:
        return 2 * config["tile_size"] * element_size(dtype)

    def default_config(self, shape: Shape, dtype: str, limits: DeviceLimits) -> Config:
        rule = heuristic_tiling(shape["n"], element_size(dtype), limits.local_memory_bytes)
        return {"tile_size": snap_down(rule.tile_elements, self.knob_values(shape)["tile_size"])}

    def flops(self, shape: Shape) -> float:
        return 8.0 * shape["n"]

    def bytes_moved(self, shape: Shape, dtype: str) -> float:
        return 2.0 * shape["n"] * element_size(dtype)

    def tensor_bytes(self, shape: Shape, dtype: str) -> dict[str, int]:
        """``x`` and ``out``, ``n`` elements each (a spec that declares none is counted from
        ``bytes_moved``: see :class:`~tiletune.kernels.declaration.KernelDeclaration`)."""
        size = shape["n"] * element_size(dtype)
        return {"x": size, "out": size}

    def workspace_bytes(self, shape: Shape, dtype: str) -> dict[str, int]:
        """The reference works in float64: its copy of ``x`` and its result, 8 bytes an element."""
        return {"x_float64": 8 * shape["n"], "reference": 8 * shape["n"]}


GELU = GeluDeclaration()
