"""``matmul``'s vendor implementation: ``torch.matmul`` (the BLAS call ``aten::mm`` makes), reading
transposed operands in place as the tiled kernel does, on every device."""

from __future__ import annotations

import torch

from tiletune.kernels.declaration import Shape
from tiletune.kernels.spec import VendorOp


def matmul(shape: Shape, device_kind: str) -> VendorOp:
    """``a @ b`` by ``torch.matmul``."""
    return lambda inputs: torch.matmul(inputs[0], inputs[1])
