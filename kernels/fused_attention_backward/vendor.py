"""``fused_attention_backward``'s vendor implementation: torch's fused attention backward on CPUs
(``aten::_scaled_dot_product_flash_attention_for_cpu_backward``, what autograd runs for
``F.scaled_dot_product_attention`` there) on the forward's ``out`` and ``lse``; where it has none,
as the forward's (:mod:`tiletune.kernels.fused_attention.vendor`). It takes no gradient of ``lse``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from tiletune.kernels.declaration import Shape
from tiletune.kernels.fused_attention.vendor import torch_is_causal
from tiletune.kernels.spec import VendorOp

#: ``(dq, dk, dv)`` of the inputs ``run`` takes (``q, k, v, out, lse, grad_out[, mask]``) and the
#: forward's scale (None: ``1 / sqrt(head_dim)``).
VendorGradients = Callable[[Sequence[torch.Tensor], float | None], tuple[torch.Tensor, ...]]


def gradients(shape: Shape, device_kind: str) -> VendorGradients | None:
    """torch's attention backward for ``shape``, or None."""
    is_causal = torch_is_causal(shape, device_kind)
    if is_causal is None:
        return None

    def backward(inputs: Sequence[torch.Tensor], scale: float | None) -> tuple[torch.Tensor, ...]:
        q, k, v, out, lse, grad = inputs[:6]
        mask = inputs[6] if len(inputs) == 7 else None
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad, q, k, v, out, lse, 0.0, is_causal, attn_mask=mask, scale=scale
        )
        return dq, dk, dv

    return backward


def gradients_only(shape: Shape, device_kind: str) -> VendorOp | None:
    """The gradients at the default scale (what ``run`` returns), or None."""
    backward = gradients(shape, device_kind)
    return None if backward is None else (lambda inputs: backward(inputs, None))
