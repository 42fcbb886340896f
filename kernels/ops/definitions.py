"""The operators: ``torch.ops.tiletune.<kernel>``, each with its implementation, fake and backward.

The implementation is :func:`~tiletune.kernels.ops.dispatch.run_kernel` (the device's kernel under
the current source's config); the fake gives the output's size and dtype from the inputs' (what
``torch.compile`` and meta tensors need: outputs are contiguous, whatever the inputs' strides); the
backward is :mod:`~tiletune.kernels.ops.backward`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from tiletune.kernels.ops import backward
from tiletune.kernels.ops.dispatch import run_kernel

NAMESPACE = "tiletune"


@torch.library.custom_op(f"{NAMESPACE}::add", mutates_args=())
def add(a: Tensor, b: Tensor) -> Tensor:
    """``a + b``: tensors of one size and dtype."""
    return run_kernel("add", (a, b))


@add.register_fake
def _add_fake(a: Tensor, b: Tensor) -> Tensor:
    return a.new_empty(a.shape)


def _add_backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor]:
    return grad, grad


add.register_autograd(_add_backward)


@torch.library.custom_op(f"{NAMESPACE}::softmax", mutates_args=())
def softmax(x: Tensor) -> Tensor:
    """Softmax over the last dim."""
    return run_kernel("softmax", (x,))


@softmax.register_fake
def _softmax_fake(x: Tensor) -> Tensor:
    return x.new_empty(x.shape)


def _softmax_setup(ctx: Any, inputs: tuple[Tensor], output: Tensor) -> None:
    ctx.save_for_backward(output)


def _softmax_backward(ctx: Any, grad: Tensor) -> Tensor:
    (out,) = ctx.saved_tensors
    return backward.softmax_backward(out, grad)


softmax.register_autograd(_softmax_backward, setup_context=_softmax_setup)


@torch.library.custom_op(f"{NAMESPACE}::rms_norm", mutates_args=())
def rms_norm(x: Tensor, weight: Tensor) -> Tensor:
    """``x / sqrt(mean(x^2, -1) + 1e-6) * weight``, ``weight`` a vector of ``x``'s last dim."""
    return run_kernel("rms_norm", (x, weight))


@rms_norm.register_fake
def _rms_norm_fake(x: Tensor, weight: Tensor) -> Tensor:
    return x.new_empty(x.shape)


def _rms_norm_setup(ctx: Any, inputs: tuple[Tensor, Tensor], output: Tensor) -> None:
    ctx.save_for_backward(*inputs)


def _rms_norm_backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor]:
    x, weight = ctx.saved_tensors
    return backward.rms_norm_backward(x, weight, grad)


rms_norm.register_autograd(_rms_norm_backward, setup_context=_rms_norm_setup)


@torch.library.custom_op(f"{NAMESPACE}::matmul", mutates_args=())
def matmul(a: Tensor, b: Tensor) -> Tensor:
    """``a [m, k] @ b [k, n]``."""
    return run_kernel("matmul", (a, b))


@matmul.register_fake
def _matmul_fake(a: Tensor, b: Tensor) -> Tensor:
    return a.new_empty((a.shape[0], b.shape[1]))


def _matmul_setup(ctx: Any, inputs: tuple[Tensor, Tensor], output: Tensor) -> None:
    ctx.save_for_backward(*inputs)


def _matmul_backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor]:
    a, b = ctx.saved_tensors
    return backward.matmul_backward(a, b, grad)


matmul.register_autograd(_matmul_backward, setup_context=_matmul_setup)


@torch.library.custom_op(f"{NAMESPACE}::fused_attention", mutates_args=())
def fused_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """``softmax(q k^T / sqrt(head_dim) [+ causal mask]) v`` over ``[batch, heads, seq, head_dim]``;
    with ``causal``, query ``i`` sees keys ``j <= i``."""
    return run_kernel("fused_attention", (q, k, v), causal=causal)


@fused_attention.register_fake
def _fused_attention_fake(q: Tensor, k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    return q.new_empty(q.shape)


def _fused_attention_setup(ctx: Any, inputs: tuple[Tensor, Tensor, Tensor, bool], output: Tensor) -> None:
    q, k, v, causal = inputs
    ctx.save_for_backward(q, k, v, output)
    ctx.causal = causal


def _fused_attention_backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, Tensor, None]:
    q, k, v, out = ctx.saved_tensors
    dq, dk, dv = backward.attention_backward(q, k, v, out, grad, causal=ctx.causal)
    return dq, dk, dv, None


fused_attention.register_autograd(_fused_attention_backward, setup_context=_fused_attention_setup)

#: Each kernel's operator, by kernel name.
OPERATORS = {
    "add": add,
    "softmax": softmax,
    "rms_norm": rms_norm,
    "matmul": matmul,
    "fused_attention": fused_attention,
}
