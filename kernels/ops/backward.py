"""The operators' backward formulas, in PyTorch (the tuned backward kernels replace them later).

Each takes what its operator saved and the output's gradient and returns the inputs' gradients.
Low-precision inputs are differentiated in float32 and the gradients cast back to their dtype
(float64 stays float64, for gradient checks). ``matmul``'s backward is two calls of the
``matmul`` operator (each its own tuned key); the others are plain torch code.
"""

from __future__ import annotations

import math

import torch

from tiletune.kernels.rms_norm.portable import EPS
from tiletune.kernels.spec import widened


def softmax_backward(out: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """``dx = y * (g - sum(g * y))`` over the last dim."""
    y, g = widened(out), widened(grad)
    return (y * (g - (g * y).sum(-1, keepdim=True))).to(out.dtype)


def rms_norm_backward(
    x: torch.Tensor, weight: torch.Tensor, grad: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``y = x * r * w`` with ``r = 1 / sqrt(mean(x^2) + eps)`` per row: ``dx = r * (g w - x̂ mean(g w x̂))``
    and ``dw = sum over rows of g x̂``, where ``x̂ = x r``."""
    xf, wf, gf = widened(x), widened(weight), widened(grad)
    rstd = torch.rsqrt(xf.square().mean(-1, keepdim=True) + EPS)
    normed = xf * rstd
    gw = gf * wf
    dx = rstd * (gw - normed * (gw * normed).mean(-1, keepdim=True))
    dw = (gf * normed).reshape(-1, x.shape[-1]).sum(0)
    return dx.to(x.dtype), dw.to(weight.dtype)


def matmul_backward(
    a: torch.Tensor, b: torch.Tensor, grad: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``da = g @ b^T`` and ``db = a^T @ g``, each by the ``matmul`` operator."""
    matmul = torch.ops.tiletune.matmul
    return matmul(grad, b.t().contiguous()), matmul(a.t().contiguous(), grad)


def attention_backward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, grad: torch.Tensor, *, causal: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The attention's gradients, recomputing the probabilities from ``q`` and ``k``:
    ``dv = P^T g``, ``dS = P * (g v^T - rowsum(g * o))``, ``dq = dS k * scale``, ``dk = dS^T q * scale``.

    The causal mask is the forward kernel's: query ``i`` sees keys ``j <= i``.
    """
    qf, kf, vf, of, gf = (widened(t) for t in (q, k, v, out, grad))
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = qf @ kf.transpose(-2, -1) * scale
    if causal:
        above = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(above, -math.inf)
    probabilities = torch.softmax(scores, dim=-1)
    dv = probabilities.transpose(-2, -1) @ gf
    dp = gf @ vf.transpose(-2, -1)
    ds = probabilities * (dp - (gf * of).sum(-1, keepdim=True))
    dq = ds @ kf * scale
    dk = ds.transpose(-2, -1) @ qf * scale
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
