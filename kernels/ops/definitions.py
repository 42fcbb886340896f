"""The operators: ``torch.ops.tiletune.<kernel>``, each with its implementation, fake and backward.

The implementation is :func:`~tiletune.kernels.ops.dispatch.run_kernel` (the device's kernel under
the current source's config); the fake gives the output's size and dtype from the inputs' (what
``torch.compile`` and meta tensors need: outputs are contiguous, whatever the inputs' strides); the
backward is the backward operators of :mod:`~tiletune.kernels.ops.gradients` (tuned backward
kernels), and for ``matmul`` two ``matmul`` calls (each its own tuned key).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from tiletune.kernels.fused_attention.formula import AttentionSaved
from tiletune.kernels.fused_attention_backward.formula import attention_backward
from tiletune.kernels.ops.dispatch import run_attention, run_tensor_kernel
from tiletune.kernels.ops.gradients import (
    NAMESPACE,
    fused_attention_backward,
    rms_norm_backward,
    softmax_backward,
)
from tiletune.kernels.rms_norm.declaration import EPS


@torch.library.custom_op(f"{NAMESPACE}::add", mutates_args=())
def add(a: Tensor, b: Tensor) -> Tensor:
    """``a + b``: tensors of one size and dtype."""
    return run_tensor_kernel("add", (a, b))


@add.register_fake
def _add_fake(a: Tensor, b: Tensor) -> Tensor:
    return a.new_empty(a.shape)


def _add_backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor]:
    return grad, grad


add.register_autograd(_add_backward)


@torch.library.custom_op(f"{NAMESPACE}::softmax", mutates_args=())
def softmax(x: Tensor) -> Tensor:
    """Softmax over the last dim."""
    return run_tensor_kernel("softmax", (x,))


@softmax.register_fake
def _softmax_fake(x: Tensor) -> Tensor:
    return x.new_empty(x.shape)


def _softmax_setup(ctx: Any, inputs: tuple[Tensor], output: Tensor) -> None:
    ctx.save_for_backward(output)


def _softmax_backward(ctx: Any, grad: Tensor) -> Tensor:
    (out,) = ctx.saved_tensors
    dx: Tensor = softmax_backward(out, grad)
    return dx


softmax.register_autograd(_softmax_backward, setup_context=_softmax_setup)


@torch.library.custom_op(f"{NAMESPACE}::rms_norm", mutates_args=())
def rms_norm(x: Tensor, weight: Tensor, eps: float = EPS) -> Tensor:
    """``x / sqrt(mean(x^2, -1) + eps) * weight``, ``weight`` a vector of ``x``'s last dim; ``eps``
    (1e-6 by default) is the kernel's call argument, not part of its tuned key."""
    return run_tensor_kernel("rms_norm", (x, weight), arguments={"eps": eps})


@rms_norm.register_fake
def _rms_norm_fake(x: Tensor, weight: Tensor, eps: float = EPS) -> Tensor:
    return x.new_empty(x.shape)


def _rms_norm_setup(ctx: Any, inputs: tuple[Tensor, Tensor, float], output: Tensor) -> None:
    x, weight, eps = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps = eps


def _rms_norm_backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, None]:
    x, weight = ctx.saved_tensors
    dx, dweight = rms_norm_backward(x, weight, grad, ctx.eps)
    return dx, dweight, None


rms_norm.register_autograd(_rms_norm_backward, setup_context=_rms_norm_setup)


@torch.library.custom_op(f"{NAMESPACE}::matmul", mutates_args=())
def matmul(a: Tensor, b: Tensor) -> Tensor:
    """``a [m, k] @ b [k, n]``."""
    return run_tensor_kernel("matmul", (a, b))


@matmul.register_fake
def _matmul_fake(a: Tensor, b: Tensor) -> Tensor:
    return a.new_empty((a.shape[0], b.shape[1]))


def _matmul_setup(ctx: Any, inputs: tuple[Tensor, Tensor], output: Tensor) -> None:
    ctx.save_for_backward(*inputs)


def _matmul_backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor]:
    """``da = g @ b^T`` and ``db = a^T @ g``, each by this operator (its own tuned key), the transposes
    read in place (their keys say so: ``b_transposed``, ``a_transposed``). Each gradient is made in
    its input's layout: for an input that is a transposed view (a ``Linear``'s ``weight.t()``) the
    transposed product, ``db = (g^T @ a)^T``, as eager's ``linear`` makes a weight's gradient, so
    autograd need not copy it into the weight's layout."""
    a, b = ctx.saved_tensors
    da, db = (
        matmul(x, y).t() if flipped else matmul(x, y) for x, y, flipped in gradient_products(a, b, grad)
    )
    return da, db


def gradient_products(a: Tensor, b: Tensor, grad: Tensor) -> tuple[tuple[Tensor, Tensor, bool], ...]:
    """The two ``matmul`` calls of ``a @ b``'s backward, ``da``'s then ``db``'s: each call's operands,
    and whether its product is the gradient's transpose (see :func:`_matmul_backward`)."""
    return (
        (b, grad.t(), True) if _transposed(a) else (grad, b.t(), False),
        (grad.t(), a, True) if _transposed(b) else (a.t(), grad, False),
    )


def _transposed(matrix: Tensor) -> bool:
    """Whether ``matrix`` is the transposed view of a contiguous matrix (``weight.t()``)."""
    return not matrix.is_contiguous() and matrix.t().is_contiguous()


matmul.register_autograd(_matmul_backward, setup_context=_matmul_setup)


@torch.library.custom_op(f"{NAMESPACE}::fused_attention", mutates_args=())
def fused_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    causal: int = 0,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    """``(out, lse)``: ``softmax(scale * q k^T + mask) v`` over ``q [batch, heads, seq_q, head_dim]``
    and ``k``, ``v [batch, kv_heads, seq_kv, head_dim]`` (grouped-query attention when ``kv_heads <
    heads``), and each query row's log-sum-exp (float32). ``mask``: additive, in q's dtype,
    ``[batch or 1, heads or 1, seq_q, seq_kv]``; ``causal``: 0 none, 1 top-left (query ``i`` sees keys
    ``j <= i``), 2 bottom-right (``j <= i + seq_kv - seq_q``); ``scale``: None is ``1 / sqrt(head_dim)``."""
    return run_attention(q, k, v, mask, causal=causal, scale=scale)


@fused_attention.register_fake
def _fused_attention_fake(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    causal: int = 0,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    return q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=torch.float32)


def _fused_attention_setup(
    ctx: Any, inputs: tuple[Any, ...], keyword_only_inputs: dict[str, Any], output: tuple[Tensor, Tensor]
) -> None:
    q, k, v, mask = inputs
    ctx.save_for_backward(q, k, v, mask, *output)
    ctx.causal, ctx.scale = keyword_only_inputs["causal"], keyword_only_inputs["scale"]
    ctx.set_materialize_grads(False)  # an unused lse's gradient stays None, not zeros


def _fused_attention_backward(
    ctx: Any, grad: Tensor | None, grad_lse: Tensor | None
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    q, k, v, mask, out, lse = ctx.saved_tensors
    if grad is None:  # only lse was used (gradients are not materialised: see the setup)
        grad = torch.zeros_like(out)
    if mask is not None and ctx.needs_input_grad[3]:  # a mask that learns: the formula gives its gradient
        saved = AttentionSaved(q, k, v, mask, out, lse, ctx.causal, ctx.scale)
        return attention_backward(saved, grad, grad_lse, mask_grad=True)
    dq, dk, dv = fused_attention_backward(
        q, k, v, mask, out, lse, grad, grad_lse, causal=ctx.causal, scale=ctx.scale
    )
    return dq, dk, dv, None


fused_attention.register_autograd(_fused_attention_backward, setup_context=_fused_attention_setup)

#: The operators autocast runs in its lower precision (torch's own ``mm`` and attention are on its
#: lower-precision list): their float inputs are cast to the autocast dtype, the kernels accumulate
#: in float32. The others take what they are given (mixed dtypes run in the first input's).
AUTOCAST_TO_LOWER_PRECISION = ("matmul", "fused_attention")
#: Devices whose autocast the operators declare.
AUTOCAST_DEVICES = ("cpu", "cuda")
_LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")  # type: ignore[no-untyped-call]


def _floating_on(arg: object, device_type: str) -> bool:
    """Whether ``arg`` is a floating-point tensor on a ``device_type`` device (what autocast casts)."""
    return isinstance(arg, Tensor) and arg.is_floating_point() and arg.device.type == device_type


def _register_autocast(name: str, device_type: str) -> None:
    """Under ``torch.autocast(device_type)``, ``name``'s floating-point tensors on that device are
    cast to the region's dtype (``torch.get_autocast_dtype``: bf16 on CPUs and fp16 on CUDA unless
    the region names another), then the operator runs with autocast off."""
    key = "Autocast" + torch._C._dispatch_key_for_device(device_type)
    excluded = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, key))
    overload = getattr(torch.ops.tiletune, name).default

    def autocast(_keyset: Any, *args: Any, **kwargs: Any) -> Any:
        dtype = torch.get_autocast_dtype(device_type)
        cast = [arg.to(dtype) if _floating_on(arg, device_type) else arg for arg in args]
        with torch._C._ExcludeDispatchKeyGuard(excluded):
            return overload(*cast, **kwargs)

    _LIBRARY.impl(name, autocast, key, with_keyset=True)  # type: ignore[no-untyped-call]


for _name in AUTOCAST_TO_LOWER_PRECISION:
    for _device in AUTOCAST_DEVICES:
        _register_autocast(_name, _device)

#: Each kernel's operator, by kernel name.
OPERATORS = {
    "add": add,
    "softmax": softmax,
    "rms_norm": rms_norm,
    "matmul": matmul,
    "fused_attention": fused_attention,
}
