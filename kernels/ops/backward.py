"""The operators' backward formulas, in PyTorch (the tuned backward kernels replace them later).

Each takes what its operator saved and the output's gradient and returns the inputs' gradients.
Low-precision inputs are differentiated in float32 and the gradients cast back to their dtype
(float64 stays float64, for gradient checks). ``matmul``'s backward is two calls of the
``matmul`` operator (each its own tuned key); the attention's recomputes its probabilities from
the forward's log-sum-exp; the others are plain torch code.
"""

from __future__ import annotations

import torch

from tiletune.kernels.fused_attention import formula
from tiletune.kernels.fused_attention.formula import AttentionSaved
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
    """``da = g @ b^T`` and ``db = a^T @ g``, each by the ``matmul`` operator, the transposes read in
    place (their keys say so: ``b_transposed``, ``a_transposed``)."""
    matmul = torch.ops.tiletune.matmul
    return matmul(grad, b.t()), matmul(a.t(), grad)


def attention_backward(
    saved: AttentionSaved, grad: torch.Tensor, grad_lse: torch.Tensor | None, *, mask_grad: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(dq, dk, dv, dmask)``, the probabilities recomputed from the saved log-sum-exp
    (FlashAttention-2's backward, untiled): ``P = exp(S - lse)``, ``dv = P^T g``,
    ``dS = P * (g v^T - rowsum(g * o) + g_lse)``, ``dq = dS k * scale``, ``dk = dS^T q * scale``;
    grouped k and v heads sum their group's gradients; ``dmask`` (when ``mask_grad``) is ``dS``
    summed over the mask's broadcast dims.
    """
    q, k, v, mask = saved.q, saved.k, saved.v, saved.mask
    heads, kv_heads = q.shape[1], k.shape[1]
    scale = formula.scale_of(q.shape[-1], saved.scale)
    scores = formula.scores(q, k, mask, saved.causal, saved.scale)
    p = formula.probabilities(scores, widened(saved.lse))
    g = widened(grad)
    dv = formula.ungrouped(p.transpose(-2, -1) @ g, kv_heads)
    dp = g @ widened(formula.grouped(v, heads)).transpose(-2, -1)
    delta = (g * widened(saved.out)).sum(-1, keepdim=True)
    if grad_lse is not None:
        delta = delta - widened(grad_lse).unsqueeze(-1)
    ds = p * (dp - delta)
    dq = ds @ widened(formula.grouped(k, heads)) * scale
    dk = formula.ungrouped(ds.transpose(-2, -1) @ widened(q) * scale, kv_heads)
    dmask = None
    if mask is not None and mask_grad:
        broadcast = [dim for dim in range(4) if mask.shape[dim] == 1 and ds.shape[dim] != 1]
        dmask = (ds.sum(broadcast, keepdim=True) if broadcast else ds).to(mask.dtype)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dmask
