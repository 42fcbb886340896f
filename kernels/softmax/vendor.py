"""``softmax``'s vendor implementation: ``torch.softmax`` over the last dim, on every device."""

from __future__ import annotations

import torch

from tiletune.kernels.declaration import Shape
from tiletune.kernels.spec import VendorOp


def softmax(shape: Shape, device_kind: str) -> VendorOp:
    """Softmax of each row by ``torch.softmax``."""
    return lambda inputs: torch.softmax(inputs[0], dim=-1)
