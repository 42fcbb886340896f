"""The backward operators: ``torch.ops.tiletune.<kernel>_backward``, what the forwards' autograd calls.

Each runs its backward kernel (``softmax_backward``, ``rms_norm_backward``,
``fused_attention_backward``) through :mod:`~tiletune.kernels.ops.dispatch`, under the config the
current source gives for the forward's shape (the backward kernels' keys carry the forward's dims):
tuned, looked up at run time and reported when missed, like the forwards. Operators of their own,
so that a compiled backward calls each as one opaque node and a profile names it; each has a fake
giving its outputs' sizes. float64 (gradient checks) runs each kernel's reference formula.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tiletune.kernels.fused_attention.formula import AttentionSaved
from tiletune.kernels.ops.dispatch import run_attention_backward, run_kernel, run_tensor_kernel
from tiletune.kernels.rms_norm.declaration import EPS

NAMESPACE = "tiletune"


@torch.library.custom_op(f"{NAMESPACE}::softmax_backward", mutates_args=())
def softmax_backward(out: Tensor, grad: Tensor) -> Tensor:
    """``softmax``'s input gradient ``out * (grad - sum(grad * out, -1))``, from its output ``out``."""
    return run_tensor_kernel("softmax_backward", (out, grad))


@softmax_backward.register_fake
def _softmax_backward_fake(out: Tensor, grad: Tensor) -> Tensor:
    return out.new_empty(out.shape)


@torch.library.custom_op(f"{NAMESPACE}::rms_norm_backward", mutates_args=())
def rms_norm_backward(x: Tensor, weight: Tensor, grad: Tensor, eps: float = EPS) -> tuple[Tensor, Tensor]:
    """``rms_norm``'s ``(dx, dweight)`` from its inputs, its ``eps`` (the kernel's call argument) and
    its output's gradient: ``dx`` in ``x``'s dtype, ``dweight`` in ``weight``'s (an fp32 weight under
    autocast gets an fp32 gradient)."""
    dx, dw = run_kernel("rms_norm_backward", (x, weight, grad), arguments={"eps": eps})
    return dx.to(x.dtype), dw.to(weight.dtype)


@rms_norm_backward.register_fake
def _rms_norm_backward_fake(
    x: Tensor, weight: Tensor, grad: Tensor, eps: float = EPS
) -> tuple[Tensor, Tensor]:
    return x.new_empty(x.shape), weight.new_empty(weight.shape)


@torch.library.custom_op(f"{NAMESPACE}::fused_attention_backward", mutates_args=())
def fused_attention_backward(  # noqa: PLR0917  (an operator's schema: the saved tensors in order)
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    out: Tensor,
    lse: Tensor,
    grad: Tensor,
    grad_lse: Tensor | None,
    *,
    causal: int = 0,
    scale: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """``(dq, dk, dv)`` of ``fused_attention`` from what it saved (its inputs, ``out`` and ``lse``) and
    the gradients of ``out`` and ``lse``: the ``fused_attention_backward`` kernel (FlashAttention-2's
    backward) under its tuned config for the forward's shape."""
    return run_attention_backward(AttentionSaved(q, k, v, mask, out, lse, causal, scale), grad, grad_lse)


@fused_attention_backward.register_fake
def _fused_attention_backward_fake(  # noqa: PLR0917  (the operator's schema)
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    out: Tensor,
    lse: Tensor,
    grad: Tensor,
    grad_lse: Tensor | None,
    *,
    causal: int = 0,
    scale: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
