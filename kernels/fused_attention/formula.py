"""``fused_attention``'s formula in plain PyTorch: the reference the tiled kernels are checked
against, the float64 path of the operator (gradient checks) and the probabilities its backward
recomputes from the saved log-sum-exp.

Semantics (the declaration's): ``q [batch, heads, seq_q, d]``, ``k``/``v [batch, kv_heads, seq_kv,
d]`` (query head ``h`` reads kv head ``h // (heads // kv_heads)``), an optional additive ``mask``
broadcast to ``[batch, heads, seq_q, seq_kv]``, ``causal`` 0 (none), 1 (top-left) or 2
(bottom-right), ``scale`` (``None``: ``1 / sqrt(d)``). A query row with no visible key has
output 0 and log-sum-exp ``-inf`` (never NaN).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tiletune.kernels.fused_attention.declaration import CAUSAL_BOTTOM_RIGHT, NO_CAUSAL
from tiletune.kernels.spec import widened


def scale_of(head_dim: int, scale: float | None) -> float:
    """The scores' factor: ``scale``, or ``1 / sqrt(head_dim)`` when it is None."""
    return head_dim**-0.5 if scale is None else scale


def grouped(kv: torch.Tensor, heads: int) -> torch.Tensor:
    """``kv [batch, kv_heads, seq, d]`` with each kv head repeated for the query heads of its group."""
    kv_heads = kv.shape[1]
    return kv if kv_heads == heads else kv.repeat_interleave(heads // kv_heads, dim=1)


def ungrouped(grad: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """A gradient ``[batch, heads, seq, d]`` of grouped k or v summed back to ``kv_heads`` heads."""
    batch, heads, seq, d = grad.shape
    if heads == kv_heads:
        return grad
    return grad.view(batch, kv_heads, heads // kv_heads, seq, d).sum(2)


def causal_mask(seq_q: int, seq_kv: int, causal: int, device: torch.device) -> torch.Tensor | None:
    """``[seq_q, seq_kv]`` booleans, True where ``causal`` hides the key; None for ``causal=0``."""
    if causal == NO_CAUSAL:
        return None
    shift = seq_kv - seq_q if causal == CAUSAL_BOTTOM_RIGHT else 0
    ones = torch.ones(seq_q, seq_kv, dtype=torch.bool, device=device)
    return ones.triu(1 + shift)


def scores(
    q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, causal: int, scale: float | None
) -> torch.Tensor:
    """``scale * q k^T + mask`` (widened: float32, float64 for float64), ``-inf`` where causal hides."""
    qf, kf = widened(q), widened(grouped(k, q.shape[1]))
    result = qf @ kf.transpose(-2, -1) * scale_of(q.shape[-1], scale)
    if mask is not None:
        result = result + widened(mask)
    hidden = causal_mask(q.shape[-2], k.shape[-2], causal, q.device)
    return result if hidden is None else result.masked_fill(hidden, float("-inf"))


def probabilities(scores: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """``exp(scores - lse)`` per row; 0 in a row whose ``lse`` is ``-inf`` (no visible key)."""
    safe = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    return torch.exp(scores - safe.unsqueeze(-1))


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    causal: int = NO_CAUSAL,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, lse)``, both widened: ``softmax(scores) v`` and each row's natural log-sum-exp."""
    s = scores(q, k, mask, causal, scale)
    lse = torch.logsumexp(s, dim=-1)
    out = probabilities(s, lse) @ widened(grouped(v, q.shape[1]))
    return out, lse


@dataclass(frozen=True)
class AttentionSaved:
    """What the attention operator saves for its backward: its inputs, output and log-sum-exp,
    and its ``causal`` and ``scale`` arguments."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    mask: torch.Tensor | None
    out: torch.Tensor
    lse: torch.Tensor
    causal: int
    scale: float | None
