"""Functions with torch's signatures and semantics, run by tiletune's operators where they cover the call.

A call the operators do not cover (a mask, dropout, a causal mask between sequences of different
lengths, which SDPA aligns bottom-right and the kernel top-left) runs torch's own function instead,
with one log line per reason, never an error.
"""

from __future__ import annotations

import logging
import math

import torch
import torch.nn.functional as torch_functional
from torch import Tensor

import tiletune.kernels.ops  # noqa: F401  (registers torch.ops.tiletune)
from tiletune.kernels.rms_norm.portable import EPS

logger = logging.getLogger(__name__)

#: dtypes the operators take (float64: their reference formula, for gradient checks).
OPERATOR_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)

_logged: set[str] = set()


def _fall_back(reason: str) -> None:
    """Log ``reason`` once per process (not while compiling: a graph holds no log call)."""
    if reason not in _logged and not torch.compiler.is_compiling():
        _logged.add(reason)
        logger.info("tiletune: %s; torch's own function runs it", reason)


def _attention_fallback_reason(
    query: Tensor, key: Tensor, value: Tensor, *, attn_mask: Tensor | None, dropout_p: float, is_causal: bool
) -> str | None:
    """Why the attention operator does not cover this call, or None when it does."""
    if attn_mask is not None:
        return "scaled_dot_product_attention with attn_mask"
    if dropout_p > 0.0:
        return "scaled_dot_product_attention with dropout_p > 0"
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return "scaled_dot_product_attention on tensors other than [batch, heads, seq, head_dim]"
    if is_causal and query.shape[-2] != key.shape[-2]:
        return "causal scaled_dot_product_attention with seq_q != seq_kv (bottom-right alignment)"
    if value.shape[-1] != query.shape[-1] or query.dtype not in OPERATOR_DTYPES:
        return "scaled_dot_product_attention with a value head_dim or dtype the kernel does not take"
    if len({query.dtype, key.dtype, value.dtype}) > 1 or len({query.device, key.device, value.device}) > 1:
        return "scaled_dot_product_attention on mixed dtypes or devices"
    return None


def scaled_dot_product_attention(  # noqa: PLR0917  (torch's signature, positions included)
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    """``torch.nn.functional.scaled_dot_product_attention``, on ``torch.ops.tiletune.fused_attention``.

    ``scale`` (default ``1 / sqrt(head_dim)``) and grouped-query attention (``enable_gqa``: ``key``
    and ``value`` with fewer heads, each shared by ``heads / kv_heads`` query heads) are covered;
    see the module docstring for what is not.
    """
    reason = _attention_fallback_reason(
        query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal
    )
    heads, kv_heads = query.shape[-3] if query.dim() == 4 else 0, key.shape[-3] if key.dim() == 4 else 0
    if reason is None and heads != kv_heads and not (enable_gqa and kv_heads and heads % kv_heads == 0):
        reason = "scaled_dot_product_attention with query and key heads that do not group"
    if reason is not None:
        _fall_back(reason)
        return torch_functional.scaled_dot_product_attention(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
        )
    if heads != kv_heads:
        key = key.repeat_interleave(heads // kv_heads, dim=-3)
        value = value.repeat_interleave(heads // kv_heads, dim=-3)
    if scale is not None:  # the kernel scales by 1 / sqrt(head_dim)
        query = query * (scale * math.sqrt(query.shape[-1]))
    out: Tensor = torch.ops.tiletune.fused_attention(query, key, value, is_causal)
    return out


def rms_norm(x: Tensor, weight: Tensor, eps: float | None = EPS) -> Tensor:
    """``x / sqrt(mean(x^2, -1) + eps) * weight`` on ``torch.ops.tiletune.rms_norm`` (whose ``eps``
    is the kernel's, 1e-6; another ``eps`` runs torch's ``rms_norm``)."""
    if eps != EPS or weight.dtype != x.dtype:
        _fall_back(f"rms_norm with eps={eps} or a weight of another dtype (the kernel's eps is {EPS})")
        return torch_functional.rms_norm(x, (x.shape[-1],), weight, eps)
    out: Tensor = torch.ops.tiletune.rms_norm(x, weight)
    return out


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ weight^T + bias`` on ``torch.ops.tiletune.matmul`` (``x``'s leading dims flattened)."""
    rows = x.reshape(-1, x.shape[-1])
    out: Tensor = torch.ops.tiletune.matmul(rows, weight.t())
    out = out.reshape(*x.shape[:-1], weight.shape[0])
    return out if bias is None else out + bias
