"""A tiled tanh-GELU declared as a tiletune kernel: the example of a user's plugin.

Knobs: ``tile_size`` (elements per tile). The working set is one input and one
output tile; the default is tiletune's hand-written rule mapped onto it.
``shape_of`` reads ``n`` from the tensor, so the kernel can be launched with the
config a tiletune client gives: ``tiletune.kernels.launcher("gelu", x, client=...)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tiletune.client.space import Dim, Knob, snap_down
from tiletune.kernels.errors import ShapeError
from tiletune.kernels.spec import (
    Config,
    DeviceLimits,
    KernelSpec,
    Shape,
    element_size,
    heuristic_tiling,
    torch_dtype,
)


class GeluSpec(KernelSpec):
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

    def shape_of(self, inputs: Sequence[torch.Tensor]) -> Shape:
        """``n``: the elements of ``x`` (any number of dims; ``run`` works on it flattened)."""
        if len(inputs) != 1:
            raise ShapeError("inputs", f"gelu takes one tensor (x), got {len(inputs)}")
        return {"n": inputs[0].numel()}

    def make_inputs(
        self, shape: Shape, dtype: str, device: torch.device, seed: int = 0
    ) -> tuple[torch.Tensor, ...]:
        generator = torch.Generator().manual_seed(seed)
        x = torch.randn(shape["n"], generator=generator).to(device=device, dtype=torch_dtype(dtype))
        return (x,)

    def reference(self, inputs: Sequence[torch.Tensor], shape: Shape) -> torch.Tensor:
        return torch.nn.functional.gelu(inputs[0].double(), approximate="tanh")

    def run(
        self, inputs: Sequence[torch.Tensor], config: Config, shape: Shape, backend: str = "torch"
    ) -> torch.Tensor:
        x = inputs[0].reshape(-1)
        out = torch.empty_like(x)
        tile = config["tile_size"]
        for start in range(0, shape["n"], tile):
            out[start : start + tile] = torch.nn.functional.gelu(x[start : start + tile], approximate="tanh")
        return out.view(inputs[0].shape)

    def flops(self, shape: Shape) -> float:
        return 8.0 * shape["n"]

    def bytes_moved(self, shape: Shape, dtype: str) -> float:
        return 2.0 * shape["n"] * element_size(dtype)

    def tensor_bytes(self, shape: Shape, dtype: str) -> dict[str, int]:
        """``x`` and ``out``, ``n`` elements each (a spec that declares none is counted from
        ``bytes_moved``: see :class:`~tiletune.kernels.spec.KernelSpec`)."""
        size = shape["n"] * element_size(dtype)
        return {"x": size, "out": size}

    def workspace_bytes(self, shape: Shape, dtype: str) -> dict[str, int]:
        """The reference works in float64: its copy of ``x`` and its result, 8 bytes an element."""
        return {"x_float64": 8 * shape["n"], "reference": 8 * shape["n"]}


SPEC = GeluSpec()
