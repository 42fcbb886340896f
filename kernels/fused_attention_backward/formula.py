"""``fused_attention_backward``'s formula in plain PyTorch: the reference the tiled kernels are checked
against and the operator's backward where no kernel runs (float64 gradient checks, a mask that learns).

FlashAttention-2's backward, untiled: the probabilities are recomputed from the forward's saved
log-sum-exp, ``P = exp(S - lse)`` with ``S = scale * q k^T + mask`` (causal keys ``-inf``; a row with
``lse = -inf`` sees no key and has ``P = 0``), then

- ``D = rowsum(grad_out * out) - grad_lse`` (``grad_lse``: the gradient of the ``lse`` output, if any),
- ``dP = grad_out v^T``, ``dS = P * (dP - D)``,
- ``dv = P^T grad_out``, ``dk = scale * dS^T q``, ``dq = scale * dS k``,

grouped k and v heads summing their group's gradients, and ``dmask`` (when asked) ``dS`` summed over
the mask's broadcast dims. Everything is computed widened (float32; float64 for float64).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from tiletune.kernels.fused_attention import formula as forward
from tiletune.kernels.fused_attention.formula import AttentionSaved
from tiletune.kernels.spec import widened


class AttentionGradients(NamedTuple):
    """The gradients of the attention's inputs: ``dq``, ``dk``, ``dv`` and, when asked for, ``dmask``."""

    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor
    dmask: torch.Tensor | None


def gradients(
    saved: AttentionSaved,
    grad_out: torch.Tensor,
    grad_lse: torch.Tensor | None = None,
    *,
    mask_grad: bool = False,
) -> AttentionGradients:
    """The widened gradients of ``fused_attention``'s inputs (see the module), for what its forward
    ``saved`` (inputs, ``out``, ``lse``, ``causal``, ``scale``: None is ``1 / sqrt(d)``), the gradient
    ``grad_out`` of its output and ``grad_lse`` of its log-sum-exp (or None): ``dq [batch, heads,
    seq_q, d]``, ``dk``/``dv [batch, kv_heads, seq_kv, d]``, ``dmask`` in the mask's (broadcast)
    shape when ``mask_grad`` and the forward had a mask, else None."""
    q, k, v, mask = saved.q, saved.k, saved.v, saved.mask
    heads, kv_heads = q.shape[1], k.shape[1]
    factor = forward.scale_of(q.shape[-1], saved.scale)
    p = forward.probabilities(forward.scores(q, k, mask, saved.causal, saved.scale), widened(saved.lse))
    g = widened(grad_out)
    dv = forward.ungrouped(p.transpose(-2, -1) @ g, kv_heads)
    dp = g @ widened(forward.grouped(v, heads)).transpose(-2, -1)
    delta = (g * widened(saved.out)).sum(-1, keepdim=True)
    if grad_lse is not None:
        delta = delta - widened(grad_lse).unsqueeze(-1)
    ds = p * (dp - delta)
    dq = ds @ widened(forward.grouped(k, heads)) * factor
    dk = forward.ungrouped(ds.transpose(-2, -1) @ widened(q) * factor, kv_heads)
    dmask = None
    if mask is not None and mask_grad:
        broadcast = [dim for dim in range(4) if mask.shape[dim] == 1 and ds.shape[dim] != 1]
        dmask = ds.sum(broadcast, keepdim=True) if broadcast else ds
    return AttentionGradients(dq, dk, dv, dmask)


def attention_backward(
    saved: AttentionSaved, grad: torch.Tensor, grad_lse: torch.Tensor | None, *, mask_grad: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(dq, dk, dv, dmask)`` of what the attention operator ``saved``, for the gradients ``grad`` of
    its output and ``grad_lse`` of its log-sum-exp: :func:`gradients`, each cast back to its input's
    dtype (``dmask`` only when ``mask_grad``)."""
    result = gradients(saved, grad, grad_lse, mask_grad=mask_grad)
    dmask = None
    if result.dmask is not None and saved.mask is not None:
        dmask = result.dmask.to(saved.mask.dtype)
    return result.dq.to(saved.q.dtype), result.dk.to(saved.k.dtype), result.dv.to(saved.v.dtype), dmask
