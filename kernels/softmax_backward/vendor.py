"""``softmax_backward``'s vendor implementation: torch's softmax backward
(``torch._softmax_backward_data``, what autograd runs for ``torch.softmax``), on every device."""

from __future__ import annotations

import torch

from tiletune.kernels.declaration import Shape
from tiletune.kernels.spec import VendorOp


def softmax_backward(shape: Shape, device_kind: str) -> VendorOp:
    """The input gradient from ``(out, grad)``, as autograd computes it for ``torch.softmax``."""
    return lambda inputs: torch._softmax_backward_data(inputs[1], inputs[0], -1, inputs[0].dtype)
