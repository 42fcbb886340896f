"""Hugging Face Transformers models on tiletune's attention: ``attn_implementation="tiletune"``.

::

    import tiletune.nn.transformers

    tiletune.nn.transformers.register()
    model = AutoModelForCausalLM.from_config(config, attn_implementation="tiletune")
    tiletune.nn.patch(model)  # its RMSNorm and Linear layers too

:func:`register` adds :func:`attention_forward` to transformers' ``AttentionInterface`` and sdpa's
mask builder to its ``AttentionMaskInterface`` under the name ``"tiletune"``: a model then builds
the masks it builds for ``"sdpa"`` (none for causal attention without padding; a boolean
``[batch, 1, seq_q, seq_kv]`` mask otherwise) and calls :func:`attention_forward` with them.
Every one of them runs ``torch.ops.tiletune.fused_attention`` (grouped kv heads read in place, the
boolean mask as an additive one); dropout runs torch's ``scaled_dot_product_attention``
(:mod:`tiletune.nn.functional`'s fallback, one log line); what sdpa's own path adds
(``position_bias``, ``softcap``) runs transformers' ``sdpa_attention_forward``.

Needs ``transformers>=4.53`` (the ``tiletune[models]`` extra): its masks come from
``AttentionMaskInterface`` since then. :mod:`tiletune.nn` never imports this module.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from tiletune.nn import functional

#: The name a model's ``attn_implementation`` gives to run tiletune's attention.
NAME = "tiletune"

#: Keyword arguments that only transformers' own sdpa path handles.
_SDPA_ONLY = ("position_bias", "softcap")


def attention_forward(  # noqa: PLR0917  (transformers' contract, positions included)
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """transformers' attention-function contract, as ``sdpa_attention_forward`` reads it.

    ``query`` is ``[batch, heads, seq_q, head_dim]``, ``key``/``value`` ``[batch, kv_heads, seq_kv,
    head_dim]`` (``module.num_key_value_groups`` query heads per kv head); the result is
    ``([batch, seq_q, heads, head_dim], None)`` (no attention weights). Causal when ``is_causal``
    (else ``module.is_causal``, else True), more than one query token and no mask, as in sdpa.
    """
    if any(kwargs.get(name) is not None for name in _SDPA_ONLY):
        out: tuple[Tensor, None] = sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal,
            **kwargs,
        )  # fmt: skip
        return out
    groups = int(getattr(module, "num_key_value_groups", 1))
    q_length = query.shape[2]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    # The shape first: under torch.compile with dynamic shapes ``q_length > 1`` is symbolic.
    causal = q_length > 1 and attention_mask is None and causal
    if causal and key.shape[2] > q_length:  # a static cache's prefill: keys past the queries are empty
        key, value = key[:, :, :q_length], value[:, :, :q_length]
    attention = functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        is_causal=bool(causal),
        scale=scaling,
        enable_gqa=groups > 1,
    )
    return attention.transpose(1, 2).contiguous(), None


def register() -> None:
    """Register ``"tiletune"`` with transformers' attention and mask interfaces (idempotent)."""
    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)
