"""``add``: ``out = a + b`` over ``n`` elements, the Ascend C hello-world.

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

from collections.abc import Sequence

import torch

from tiletune.client.space import Dim, Knob, snap_down
from tiletune.kernels.errors import ShapeError
from tiletune.kernels.native_spec import NATIVE_BACKEND, native_backends, run_native
from tiletune.kernels.pipeline import Slots, TiledLoop, execute, require_backend
from tiletune.kernels.spec import (
    BUFFER_NUM,
    FLOAT32_BYTES,
    PIPELINE_DEPTH,
    Config,
    DeviceLimits,
    KernelSpec,
    Shape,
    element_size,
    expect_inputs,
    float32_copies,
    heuristic_tiling,
    torch_dtype,
)

TILE_SIZES = tuple(1 << p for p in range(8, 23))


class AddSpec(KernelSpec):
    """Elementwise ``a + b`` tiled over one dim."""

    name = "add"
    version = 1
    description = "elementwise a + b over n elements (the Ascend C hello-world)"
    dims = (Dim("n", "number of elements"),)
    knobs: tuple[Knob, ...] = (
        Knob("tile_size", TILE_SIZES, "elements per tile", clamp_to="n"),
        BUFFER_NUM,
        PIPELINE_DEPTH,
    )

    def backends(self) -> tuple[str, ...]:
        """``torch`` (portable), and ``native`` (the C++ CPU kernel) where it is built here."""
        return native_backends()

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

    def reference(self, inputs: Sequence[torch.Tensor], shape: Shape) -> torch.Tensor:
        """``a + b`` in float32."""
        a, b = inputs
        return a.float() + b.float()

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


SPEC = AddSpec()
