"""The vendor op of each built-in kernel: torch's own implementation, the bar a tuned config must clear.

``vendor_op(spec, shape)`` is a callable on the kernel's inputs (as ``run`` takes them) that
computes the same result with torch's own op, untiled: ``torch.add``, ``torch.softmax``,
``torch.nn.functional.rms_norm``, ``torch.matmul`` and ``scaled_dot_product_attention``
(``is_causal`` from the shape). The portable, Triton and native versions of a kernel share
it (``native_add`` → ``add``'s). Kernels without one (plugins) get None.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch.nn import functional

from tiletune.kernels.declaration import Shape
from tiletune.kernels.rms_norm.portable import EPS
from tiletune.kernels.spec import KernelOutput, KernelSpec

VendorOp = Callable[[Sequence[torch.Tensor]], KernelOutput]
FAMILY_PREFIXES = ("native_", "triton_")


def _add(shape: Shape) -> VendorOp:
    return lambda inputs: torch.add(inputs[0], inputs[1])


def _softmax(shape: Shape) -> VendorOp:
    return lambda inputs: torch.softmax(inputs[0], dim=-1)


def _rms_norm(shape: Shape) -> VendorOp:
    cols = (shape["cols"],)
    return lambda inputs: functional.rms_norm(inputs[0], cols, inputs[1], EPS)


def _matmul(shape: Shape) -> VendorOp:
    return lambda inputs: torch.matmul(inputs[0], inputs[1])


def _retained_backward(forward: Callable[[Sequence[torch.Tensor]], torch.Tensor], wrt: int) -> VendorOp:
    """torch's backward of ``forward``: called on ``(*forward_inputs, grad)``, the gradients of the
    first ``wrt`` forward inputs. The forward graph is built on the first call (on detached copies
    that require grad) and kept for calls on the same tensors, so a call times the backward alone."""
    built: dict[tuple[int, ...], tuple[torch.Tensor, tuple[torch.Tensor, ...]]] = {}

    def backward(inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        *forward_inputs, grad = inputs
        key = tuple(id(t) for t in inputs)
        if key not in built:
            built.clear()
            leaves = tuple(t.detach().requires_grad_(index < wrt) for index, t in enumerate(forward_inputs))
            with torch.enable_grad():
                built[key] = (forward(leaves), leaves[:wrt])
        out, leaves = built[key]
        return torch.autograd.grad(out, leaves, grad, retain_graph=True)

    return backward


def _softmax_backward(shape: Shape) -> VendorOp:
    return lambda inputs: torch._softmax_backward_data(inputs[1], inputs[0], -1, inputs[0].dtype)


def _rms_norm_backward(shape: Shape) -> VendorOp:
    cols = (shape["cols"],)
    return _retained_backward(lambda xw: functional.rms_norm(xw[0], cols, xw[1], EPS), wrt=2)


def _attention_mask(shape: Shape, mask: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor | None:
    """The additive mask torch's attention takes for ``shape``: the kernel's mask, plus the causal
    band where ``is_causal`` cannot say it (bottom-right aligned with ``seq_q != seq_kv``, or a mask)."""
    seq_q, seq_kv, causal = shape["seq_q"], shape["seq_kv"], shape["causal"]
    if not causal or (causal == 1 and mask is None) or (causal == 2 and seq_q == seq_kv and mask is None):
        return mask
    diagonal = seq_kv - seq_q if causal == 2 else 0
    band = torch.ones(seq_q, seq_kv, dtype=torch.bool, device=like.device).tril(diagonal)
    bias = torch.zeros(seq_q, seq_kv, dtype=like.dtype, device=like.device).masked_fill(~band, -torch.inf)
    return bias if mask is None else mask + bias


def _torch_attention(shape: Shape) -> Callable[[Sequence[torch.Tensor]], torch.Tensor]:
    """``scaled_dot_product_attention`` on ``(q, k, v[, mask])`` for ``shape`` (grouped heads, both
    causal alignments, the mask)."""
    gqa = shape["heads"] != shape["kv_heads"]

    def attention(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        q, k, v = tensors[:3]
        mask = _attention_mask(shape, tensors[3] if len(tensors) > 3 else None, q)
        causal = bool(shape["causal"]) and mask is None
        return functional.scaled_dot_product_attention(q, k, v, mask, is_causal=causal, enable_gqa=gqa)

    return attention


def _attention(shape: Shape) -> VendorOp:
    return _torch_attention(shape)


def _attention_backward(shape: Shape) -> VendorOp:
    backward = _retained_backward(_torch_attention(shape), wrt=3)
    # The kernel's inputs are (q, k, v, out, lse, grad[, mask]): torch's forward takes (q, k, v[, mask]).
    return lambda inputs: backward((*inputs[:3], *inputs[6:], inputs[5]))


VENDOR_OPS: dict[str, Callable[[Shape], VendorOp]] = {
    "add": _add,
    "softmax": _softmax,
    "rms_norm": _rms_norm,
    "matmul": _matmul,
    "fused_attention": _attention,
    "softmax_backward": _softmax_backward,
    "rms_norm_backward": _rms_norm_backward,
    "fused_attention_backward": _attention_backward,
}


def vendor_name(spec: KernelSpec) -> str:
    """The portable kernel a spec implements: its name without a ``native_``/``triton_`` prefix."""
    for prefix in FAMILY_PREFIXES:
        if spec.name.startswith(prefix):
            return spec.name.removeprefix(prefix)
    return spec.name


def vendor_op(spec: KernelSpec, shape: Shape) -> VendorOp | None:
    """torch's own op for ``spec``'s call of ``shape``, or None when the kernel has none."""
    make = VENDOR_OPS.get(vendor_name(spec))
    return make(shape) if make is not None else None
