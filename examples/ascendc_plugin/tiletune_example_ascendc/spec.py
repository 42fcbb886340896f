"""``ascendc_add_tiles``'s spec (an NPU worker runs it): a bisheng build per config, on torch_npu's stream.

Each config's ``tile_length`` and ``buffer_num`` select a build from tiletune's build cache (built ahead by
the worker, :mod:`tiletune.tuner.measure.build_ahead`); ``run`` loads it with ctypes and calls its host
launcher ``add_tiles_do(block_dim, stream, x, y, z, n)`` on the tensors' device pointers. Not run here.
"""

from __future__ import annotations

import ctypes
import importlib.util
import shutil
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path

import torch

from tiletune.kernels.build_cache import shared_cache
from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.spec import KernelSpec
from tiletune_example_ascendc.build import recipe
from tiletune_example_ascendc.space import AddTilesDeclaration


@cache
def _launcher(path: Path) -> ctypes._NamedFuncPointer:
    function = ctypes.CDLL(str(path)).add_tiles_do
    function.argtypes = [ctypes.c_uint32, ctypes.c_void_p, *[ctypes.c_void_p] * 3, ctypes.c_uint32]
    function.restype = None
    return function


class AddTilesSpec(AddTilesDeclaration, KernelSpec):
    """The Ascend C kernel: NPU only, where torch_npu and the CANN compiler are installed."""

    def backends(self) -> tuple[str, ...]:
        return ("ascendc",)

    def supports(self, device_kind: str) -> bool:
        return (
            device_kind == "npu"
            and importlib.util.find_spec("torch_npu") is not None
            and shutil.which(recipe().compiler) is not None
        )

    def build_config(self, config: Mapping[str, int]) -> Path:
        """The build of ``config``'s constants (``BuildError`` with bisheng's message on failure)."""
        return shared_cache().get(recipe(), self.build_values(dict(config)))

    def make_inputs(
        self, shape: Shape, dtype: str, device: torch.device, seed: int = 0
    ) -> tuple[torch.Tensor, ...]:
        generator = torch.Generator().manual_seed(seed)
        x, y = (torch.randn(shape["n"], generator=generator) for _ in range(2))
        return x.to(device, torch.float16), y.to(device, torch.float16)

    def reference(self, inputs: Sequence[torch.Tensor], shape: Shape) -> torch.Tensor:
        return inputs[0].float() + inputs[1].float()

    def run(
        self, inputs: Sequence[torch.Tensor], config: Config, shape: Shape, backend: str = "ascendc"
    ) -> torch.Tensor:
        import torch_npu  # the NPU's stream (an aclrtStream)

        x, y = inputs
        z = torch.empty_like(x)
        stream = torch_npu.npu.current_stream().npu_stream
        launch = _launcher(self.build_config(config))
        launch(config["block_dim"], stream, x.data_ptr(), y.data_ptr(), z.data_ptr(), shape["n"])
        return z


SPEC = AddTilesSpec()
