"""``rms_norm_backward``'s formula, untiled: the reference the tiled kernels are checked against and
torch's op (:mod:`tiletune.kernels.rms_norm_backward.vendor`: torch has no backward op of its own for
``F.rms_norm``; this is what its autograd computes, in closed form)."""

from __future__ import annotations

import torch

from tiletune.kernels.rms_norm.declaration import EPS
from tiletune.kernels.spec import widened


def gradients(
    x: torch.Tensor, w: torch.Tensor, grad: torch.Tensor, eps: float = EPS
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dx, dw)`` in float32 (float64 for float64): with ``r = rsqrt(mean(x^2) + eps)`` per row
    (``eps`` the forward's; the operator's default when none is given),
    ``dx = r * (g w - x r^2 mean(g w x))`` shaped like ``x``, and ``dw = sum over rows of g x r``,
    a vector of ``cols``."""
    xf, wf, gf = widened(x), widened(w), widened(grad)
    rstd = torch.rsqrt(xf.square().mean(-1, keepdim=True).add_(eps))
    scaled = gf * wf
    dx = (scaled - xf * (scaled * xf).mean(-1, keepdim=True).mul_(rstd.square())).mul_(rstd)
    dw = (gf * xf).mul_(rstd).reshape(-1, x.shape[-1]).sum(0)
    return dx, dw
