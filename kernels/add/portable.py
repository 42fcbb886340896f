"""``add``: ``out = a + b`` over ``n`` elements, the Ascend C hello-world: its portable implementation.

Its declaration (dims, knobs, working set, default rule, counts) is
:mod:`tiletune.kernels.add.declaration`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tiletune.kernels.add import vendor
from tiletune.kernels.add.declaration import AddDeclaration
from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.errors import ShapeError
from tiletune.kernels.native.space import NATIVE_BACKEND
from tiletune.kernels.native.spec import native_backends, run_native
from tiletune.kernels.pipeline import Slots, TiledLoop, execute, require_backend
from tiletune.kernels.spec import KernelSpec, VendorOp, expect_inputs, torch_dtype, widened


class AddSpec(AddDeclaration, KernelSpec):
    """Elementwise ``a + b`` tiled over one dim."""

    def backends(self) -> tuple[str, ...]:
        """``torch`` (portable), and ``native`` (the C++ CPU kernel) where it is built here."""
        return native_backends()

    def shape_of(self, inputs: Sequence[torch.Tensor]) -> Shape:
        """``n``: the elements of ``a`` and ``b``, which must have the same size (any number of dims)."""
        expect_inputs(self.name, inputs, ("a", "b"))
        a, b = inputs
        if a.shape != b.shape:
            raise ShapeError("inputs.b", f"must have a's size {list(a.shape)}, got {list(b.shape)}")
        return {"n": a.numel()}

    def make_inputs(
        self, shape: Shape, dtype: str, device: torch.device, seed: int = 0
    ) -> tuple[torch.Tensor, ...]:
        """``a`` and ``b``: standard normal, ``n`` elements each."""
        generator = torch.Generator().manual_seed(seed)
        a, b = torch.randn((2, shape["n"]), generator=generator).to(device, torch_dtype(dtype)).unbind(0)
        return a.contiguous(), b.contiguous()

    def vendor(self, shape: Shape, device_kind: str) -> VendorOp | None:
        """``torch.add`` (:mod:`tiletune.kernels.add.vendor`)."""
        return vendor.add(shape, device_kind)

    def reference(self, inputs: Sequence[torch.Tensor], shape: Shape) -> torch.Tensor:
        """``a + b`` in float32 (float64 for float64)."""
        a, b = inputs
        return widened(a) + widened(b)

    def run(
        self, inputs: Sequence[torch.Tensor], config: Config, shape: Shape, backend: str = "torch"
    ) -> torch.Tensor:
        """Tiled ``a + b`` through the pipeline executor (``native``: the C++ kernel)."""
        if backend == NATIVE_BACKEND:
            return run_native("add", inputs, config, shape)
        require_backend(self.backends(), backend)
        a, b = (t.reshape(-1) for t in inputs)  # flat: n elements, whatever the callers' sizes
        out = torch.empty_like(a)
        tile, buffers = config["tile_size"], config["buffer_num"]
        a_tiles, b_tiles, out_tiles = (torch.split(t, tile) for t in (a, b, out))
        a_slots, b_slots, out_slots = (Slots(buffers, tile, a.dtype, a.device) for _ in range(3))
        sizes = [(t.numel(),) for t in a_tiles]

        def copy_in(step: int, slot: int) -> None:
            a_slots.view(slot, sizes[step]).copy_(a_tiles[step])
            b_slots.view(slot, sizes[step]).copy_(b_tiles[step])

        def compute(step: int, slot: int, out_slot: int) -> None:
            size = sizes[step]
            torch.add(a_slots.view(slot, size), b_slots.view(slot, size), out=out_slots.view(out_slot, size))

        def copy_out(tile_index: int, out_slot: int) -> None:
            out_tiles[tile_index].copy_(out_slots.view(out_slot, sizes[tile_index]))

        loop = TiledLoop([1] * len(sizes), copy_in, compute, copy_out)
        execute(loop, buffers, config["pipeline_depth"], a.device)
        return out.view(inputs[0].shape)


SPEC = AddSpec()
