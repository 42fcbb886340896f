"""``rms_norm``'s vendor implementation: ``torch.nn.functional.rms_norm`` (what ``torch.nn.RMSNorm``
runs), on every device."""

from __future__ import annotations

from torch.nn import functional

from tiletune.kernels.declaration import Shape
from tiletune.kernels.rms_norm.declaration import EPS
from tiletune.kernels.spec import VendorOp


def rms_norm(shape: Shape, device_kind: str, eps: float = EPS) -> VendorOp:
    """``x / sqrt(mean(x^2) + eps) * w`` by ``F.rms_norm`` over the last dim, at the call's ``eps``
    (the operator's default when none is given)."""
    cols = (shape["cols"],)
    return lambda inputs: functional.rms_norm(inputs[0], cols, inputs[1], eps)
