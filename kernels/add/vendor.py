"""``add``'s vendor implementation: ``torch.add``, on every device."""

from __future__ import annotations

import torch

from tiletune.kernels.declaration import Shape
from tiletune.kernels.spec import VendorOp


def add(shape: Shape, device_kind: str) -> VendorOp:
    """``a + b`` by ``torch.add``."""
    return lambda inputs: torch.add(inputs[0], inputs[1])
