"""``fused_attention``'s vendor implementation: torch's fused attention on CPUs
(``aten::_scaled_dot_product_flash_attention_for_cpu``, what ``F.scaled_dot_product_attention``
runs there), which gives the log-sum-exp the backward kernel takes: float32 ``[batch, heads,
seq_q]``, natural log, as the tiled kernels give it.

Where there is none: other devices (their fused attentions keep the log-sum-exp in layouts of
their own), and bottom-right causal attention of ``seq_q != seq_kv`` (torch's ``is_causal`` is
top-left). Grouped-query attention, masks and a mask with causal are torch's too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from tiletune.kernels.declaration import Shape
from tiletune.kernels.spec import VendorOp

#: ``(out, lse)`` of the inputs ``run`` takes (``q, k, v[, mask]``) and the call's scale (None:
#: ``1 / sqrt(head_dim)``).
VendorAttention = Callable[[Sequence[torch.Tensor], float | None], tuple[torch.Tensor, torch.Tensor]]


def torch_is_causal(shape: Shape, device_kind: str) -> bool | None:
    """torch's ``is_causal`` for ``shape`` on a ``device_kind`` device, or None where torch has no op."""
    causal = shape["causal"]
    if device_kind != "cpu" or (causal == 2 and shape["seq_q"] != shape["seq_kv"]):
        return None
    return bool(causal)


def attention(shape: Shape, device_kind: str) -> VendorAttention | None:
    """torch's attention for ``shape`` (see the module), or None."""
    is_causal = torch_is_causal(shape, device_kind)
    if is_causal is None:
        return None

    def attend(inputs: Sequence[torch.Tensor], scale: float | None) -> tuple[torch.Tensor, torch.Tensor]:
        q, k, v = inputs[:3]
        mask = inputs[3] if len(inputs) == 4 else None
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, is_causal, attn_mask=mask, scale=scale
        )
        return out, lse

    return attend


def output(shape: Shape, device_kind: str) -> VendorOp | None:
    """The attention's output alone (what ``run`` returns), or None."""
    attend = attention(shape, device_kind)
    return None if attend is None else (lambda inputs: attend(inputs, None)[0])
