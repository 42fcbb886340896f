"""A tiled tanh-GELU as a tiletune kernel: its declaration (``space.py``) and what runs it.

``shape_of`` reads ``n`` from the tensor, so the kernel can be launched with the
config a tiletune client gives: ``tiletune.kernels.launcher("gelu", x, client=...)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.errors import ShapeError
from tiletune.kernels.spec import KernelSpec, torch_dtype
from tiletune_example_gelu.space import GeluDeclaration


class GeluSpec(GeluDeclaration, KernelSpec):
    """``y = gelu(x, approximate="tanh")`` over a flat tensor, tile by tile."""

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


SPEC = GeluSpec()
