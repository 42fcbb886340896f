"""``rms_norm_backward``'s vendor implementation: the gradients autograd computes for
``F.rms_norm`` (torch has no backward op of its own for it on CPUs), in float32, on every device."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tiletune.kernels.declaration import Shape
from tiletune.kernels.rms_norm.declaration import EPS
from tiletune.kernels.spec import VendorOp


def rms_norm_backward(shape: Shape, device_kind: str) -> VendorOp:
    """``(dx, dw)`` from ``(x, w, grad)``: with ``r = rsqrt(mean(x^2) + eps)`` per row,
    ``dx = r * (g w - x r^2 mean(g w x))`` and ``dw = sum over rows of g x r``."""
    cols = shape["cols"]

    def backward(inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        x, w, grad = inputs
        xf, wf, gf = x.float(), w.float(), grad.float()  # the tensors themselves in float32
        rstd = torch.rsqrt(xf.square().mean(-1, keepdim=True).add_(EPS))
        scaled = gf * wf
        dx = (scaled - xf * (scaled * xf).mean(-1, keepdim=True).mul_(rstd.square())).mul_(rstd)
        dw = (gf * xf).mul_(rstd).reshape(-1, cols).sum(0)
        return dx.to(x.dtype), dw.to(w.dtype)

    return backward
