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
from tiletune.kernels.spec import KernelSpec

VendorOp = Callable[[Sequence[torch.Tensor]], torch.Tensor]
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


def _attention(shape: Shape) -> VendorOp:
    causal = bool(shape["causal"])
    return lambda inputs: functional.scaled_dot_product_attention(
        inputs[0], inputs[1], inputs[2], is_causal=causal
    )


VENDOR_OPS: dict[str, Callable[[Shape], VendorOp]] = {
    "add": _add,
    "softmax": _softmax,
    "rms_norm": _rms_norm,
    "matmul": _matmul,
    "fused_attention": _attention,
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
