"""A plugin-style kernel whose bad tilings behave as they do on an accelerator: crash, hang, poison.

``faulty`` scales a flat tensor by 2, tile by tile (``tile_size``). Three of its tile sizes are
broken the ways an accelerator kernel breaks: :data:`SEGFAULT_TILE` reads address 0 (the process
dies of SIGSEGV), :data:`HANG_TILE` never returns, :data:`DEVICE_ERROR_TILE` raises a
:class:`~tiletune.kernels.errors.DeviceError` with CUDA's illegal-memory-access text. The others,
the default (:data:`DEFAULT_TILE`) among them, are correct. The spec is a module-level instance of
a module-level class, so it travels to a trial process by reference.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Sequence

import torch

from tiletune.client.space import DeviceLimits, Dim, Knob
from tiletune.kernels.declaration import Config, Shape, element_size
from tiletune.kernels.errors import DeviceError
from tiletune.kernels.spec import KernelSpec, torch_dtype

SEGFAULT_TILE, HANG_TILE, DEVICE_ERROR_TILE = 32, 64, 128
DEFAULT_TILE = 512
TILES = (16, SEGFAULT_TILE, HANG_TILE, DEVICE_ERROR_TILE, 256, DEFAULT_TILE)
#: The configs that fail, and the words their stored reason must hold.
FAULTS = {
    SEGFAULT_TILE: "the trial process died: signal SIGSEGV",
    HANG_TILE: "timed out after",
    DEVICE_ERROR_TILE: "DeviceError: an illegal memory access was encountered",
}


class FaultySpec(KernelSpec):
    """``out = 2 * x`` over ``n`` elements in tiles of ``tile_size``; three tile sizes are broken."""

    name = "faulty"
    version = 1
    description = "a kernel whose tile sizes 32, 64 and 128 crash, hang and poison the device (tests)"
    dims = (Dim("n", "number of elements"),)
    knobs = (Knob("tile_size", TILES, "elements per tile"),)

    def working_set_bytes(self, config: Config, shape: Shape, dtype: str) -> int:
        return 2 * config["tile_size"] * element_size(dtype)

    def default_config(self, shape: Shape, dtype: str, limits: DeviceLimits) -> Config:
        return {"tile_size": DEFAULT_TILE}

    def flops(self, shape: Shape) -> float:
        return float(shape["n"])

    def bytes_moved(self, shape: Shape, dtype: str) -> float:
        return 2.0 * shape["n"] * element_size(dtype)

    def make_inputs(
        self, shape: Shape, dtype: str, device: torch.device, seed: int = 0
    ) -> tuple[torch.Tensor, ...]:
        generator = torch.Generator().manual_seed(seed)
        return (torch.randn(shape["n"], generator=generator).to(device=device, dtype=torch_dtype(dtype)),)

    def reference(self, inputs: Sequence[torch.Tensor], shape: Shape) -> torch.Tensor:
        return inputs[0].float() * 2

    def run(
        self, inputs: Sequence[torch.Tensor], config: Config, shape: Shape, backend: str = "torch"
    ) -> torch.Tensor:
        tile = config["tile_size"]
        if tile == SEGFAULT_TILE:
            ctypes.string_at(0)  # reads address 0: SIGSEGV
        if tile == HANG_TILE:
            while True:
                time.sleep(1.0)
        if tile == DEVICE_ERROR_TILE:
            raise DeviceError("an illegal memory access was encountered")
        x = inputs[0]
        out = torch.empty_like(x)
        for start in range(0, shape["n"], tile):
            torch.mul(x[start : start + tile], 2, out=out[start : start + tile])
        return out


SPEC = FaultySpec()


class BrokenDefaultSpec(FaultySpec):
    """``faulty`` whose default tiling is the one that segfaults: a fresh process cannot run it."""

    name = "faulty_default"
    description = "a kernel whose default tiling segfaults (tests)"

    def default_config(self, shape: Shape, dtype: str, limits: DeviceLimits) -> Config:
        return {"tile_size": SEGFAULT_TILE}


BROKEN_DEFAULT_SPEC = BrokenDefaultSpec()


class HangingDefaultSpec(FaultySpec):
    """``faulty`` whose default tiling never returns: a fresh process hangs on it."""

    name = "faulty_hanging_default"
    description = "a kernel whose default tiling hangs (tests)"

    def default_config(self, shape: Shape, dtype: str, limits: DeviceLimits) -> Config:
        return {"tile_size": HANG_TILE}


HANGING_DEFAULT_SPEC = HangingDefaultSpec()
