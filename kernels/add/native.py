"""``native_add``: ``add`` in C++ (``kernels/native/csrc/add.cpp``), tiles spread over cores.

Knobs: ``add``'s (``tile_size``, ``buffer_num``, ``pipeline_depth``) and ``block_dim``. A
core takes a contiguous range of tiles. Float32 tiles are added straight from global memory
into ``out`` (each element is read once, so a slot would only cost a copy: the copy-in is the
prefetch issued ``pipeline_depth - 1`` tiles ahead and ``buffer_num`` has no effect); half and
bfloat16 tiles are copied into float32 slots first. Compute is fused with copy-out (streaming
stores for outputs larger than the last-level cache).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

import torch

from tiletune.kernels.add.declaration import NativeAddDeclaration
from tiletune.kernels.add.portable import AddSpec
from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.native.spec import NativeSpec


class NativeAddSpec(NativeAddDeclaration, NativeSpec, AddSpec):
    """``add`` as a native CPU kernel."""

    def launch(
        self, module: ModuleType, inputs: Sequence[torch.Tensor], config: Config, shape: Shape
    ) -> torch.Tensor:
        """The extension's ``add`` on the flat inputs, shaped like ``a``."""
        a, b = inputs
        flat = a.dim() == 1  # the common case: no reshape or view to pay for per call
        out: torch.Tensor = module.add(
            a if flat else a.reshape(-1),
            b if flat else b.reshape(-1),
            config["tile_size"],
            config["block_dim"],
            config["buffer_num"],
            config["pipeline_depth"],
        )
        return out if flat else out.view(a.shape)


SPEC = NativeAddSpec()
