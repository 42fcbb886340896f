"""``rms_norm_backward``'s vendor implementation: the gradients autograd computes for ``F.rms_norm``
(torch has no backward op of its own for it on CPUs), by the formula
(:func:`~tiletune.kernels.rms_norm_backward.formula.gradients`) in float32, on every device."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tiletune.kernels.declaration import Shape
from tiletune.kernels.rms_norm.declaration import EPS
from tiletune.kernels.rms_norm_backward.formula import gradients
from tiletune.kernels.spec import VendorOp


def rms_norm_backward(shape: Shape, device_kind: str, eps: float = EPS) -> VendorOp:
    """``(dx, dw)`` from ``(x, w, grad)`` at the forward's ``eps`` (the operator's default when none
    is given), in the inputs' dtypes."""

    def backward(inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        x, w, grad = inputs
        dx, dw = gradients(x, w, grad, eps)
        return dx.to(x.dtype), dw.to(w.dtype)

    return backward
