"""Functions with torch's signatures and semantics, run by tiletune's operators where they cover the call.

A call the operators do not cover (dropout, say) runs torch's own function instead, with one log
line per reason, never an error.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as torch_functional
from torch import Tensor
from torch.nn.attention.bias import CausalBias, CausalVariant

import tiletune.kernels.ops  # noqa: F401  (registers torch.ops.tiletune)
from tiletune.kernels.fused_attention.declaration import CAUSAL_BOTTOM_RIGHT, CAUSAL_TOP_LEFT, NO_CAUSAL
from tiletune.kernels.rms_norm.declaration import EPS

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
    query: Tensor, key: Tensor, value: Tensor, *, dropout_p: float, enable_gqa: bool
) -> str | None:
    """Why the attention operator does not cover this call, or None when it does."""
    if dropout_p > 0.0:
        return "scaled_dot_product_attention with dropout_p > 0"
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return "scaled_dot_product_attention on tensors other than [batch, heads, seq, head_dim]"
    if value.shape[-1] != query.shape[-1] or query.dtype not in OPERATOR_DTYPES:
        return "scaled_dot_product_attention with a value head_dim or dtype the kernel does not take"
    if len({query.dtype, key.dtype, value.dtype}) > 1 or len({query.device, key.device, value.device}) > 1:
        return "scaled_dot_product_attention on mixed dtypes or devices"
    heads, kv_heads = query.shape[1], key.shape[1]
    if heads != kv_heads and not (enable_gqa and heads % kv_heads == 0):
        return "scaled_dot_product_attention with query and key heads that do not group"
    return None


def _mask_operand(
    attn_mask: Tensor | CausalBias | None, query: Tensor, key: Tensor, is_causal: bool
) -> tuple[Tensor | None, int] | str:
    """The operator's ``(mask, causal)`` for SDPA's ``attn_mask`` and ``is_causal``, or why not.

    ``is_causal`` is torch's top-left alignment (``causal=1``); a ``CausalBias`` (torch's
    ``causal_upper_left`` / ``causal_lower_right``) is ``causal`` 1 / 2 with no mask; a boolean mask
    (True: attend) becomes additive (0 / -inf) in the query's dtype; a float mask is cast to it.
    Masks broadcast as torch's do; the operator reads them through their strides (no copy of a
    broadcast dim).
    """
    if isinstance(attn_mask, CausalBias):
        if is_causal:
            return "scaled_dot_product_attention with is_causal and a CausalBias"
        return (
            None,
            CAUSAL_BOTTOM_RIGHT if attn_mask.variant == CausalVariant.LOWER_RIGHT else CAUSAL_TOP_LEFT,
        )
    if attn_mask is None:
        return None, CAUSAL_TOP_LEFT if is_causal else NO_CAUSAL
    if is_causal or attn_mask.dim() > 4:
        return "scaled_dot_product_attention with both attn_mask and is_causal, or a mask of more than 4 dims"
    if attn_mask.device != query.device:
        return "scaled_dot_product_attention with a mask on another device"
    mask = attn_mask
    if mask.dtype == torch.bool:
        mask = torch.zeros((), dtype=query.dtype, device=query.device).masked_fill(~mask, float("-inf"))
    elif mask.dtype != query.dtype:
        mask = mask.to(query.dtype)
    mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    size = (query.shape[0], query.shape[1], query.shape[2], key.shape[2])
    try:
        full = mask.expand(size)
    except RuntimeError:
        return "scaled_dot_product_attention with a mask not broadcastable to [batch, heads, seq_q, seq_kv]"
    # whole seq_q x seq_kv planes (stride 0 where broadcast), batch and heads kept at 1 where they are
    return full[: mask.shape[0], : mask.shape[1]], NO_CAUSAL


def scaled_dot_product_attention(  # noqa: PLR0917  (torch's signature, positions included)
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | CausalBias | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    """``torch.nn.functional.scaled_dot_product_attention``, on ``torch.ops.tiletune.fused_attention``.

    Covered: ``scale``; grouped-query attention (``enable_gqa``: ``key`` and ``value`` with fewer
    heads, each shared by ``heads / kv_heads`` query heads, read in place); boolean and additive
    masks broadcast to ``[batch, heads, seq_q, seq_kv]``; ``is_causal`` (top-left aligned, as torch's
    own: query ``i`` sees keys ``j <= i`` whatever the lengths) and torch's ``CausalBias`` masks
    (``causal_lower_right``: bottom-right aligned, as FlashAttention-2 and a chunked prefill need).
    A query row that sees no key gives 0 (torch's gives NaN). Not covered, run by torch's own
    function with one log line: dropout, tensors other than 4-D, another value head_dim, mixed
    dtypes or devices.
    """
    reason = _attention_fallback_reason(query, key, value, dropout_p=dropout_p, enable_gqa=enable_gqa)
    operand = _mask_operand(attn_mask, query, key, is_causal) if reason is None else reason
    if isinstance(operand, str):
        _fall_back(operand)
        return torch_functional.scaled_dot_product_attention(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
        )
    mask, causal = operand
    out: Tensor = torch.ops.tiletune.fused_attention(query, key, value, mask, causal=causal, scale=scale)[0]
    return out


def rms_norm(x: Tensor, weight: Tensor, eps: float | None = EPS) -> Tensor:
    """``x / sqrt(mean(x^2, -1) + eps) * weight`` on ``torch.ops.tiletune.rms_norm``, at any ``eps``
    (the operator's argument, not part of its tuned key); ``None`` is ``torch.finfo(x.dtype).eps``,
    as in torch's ``rms_norm``. A weight of another dtype than ``x`` runs torch's ``rms_norm``."""
    if weight.dtype != x.dtype:
        _fall_back("rms_norm with a weight of another dtype than its input")
        return torch_functional.rms_norm(x, (x.shape[-1],), weight, eps)
    out: Tensor = torch.ops.tiletune.rms_norm(x, weight, torch.finfo(x.dtype).eps if eps is None else eps)
    return out


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ weight^T + bias`` on ``torch.ops.tiletune.matmul`` (``x``'s leading dims flattened)."""
    rows = x.reshape(-1, x.shape[-1])
    out: Tensor = torch.ops.tiletune.matmul(rows, weight.t())
    out = out.reshape(*x.shape[:-1], weight.shape[0])
    return out if bias is None else out + bias
