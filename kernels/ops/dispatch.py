"""What an operator call runs: the kernel's implementation for the tensors' device, under the config
the current source gives for the call's shape.

- The answer may be torch's own op (the vendor config): it runs with nothing added beyond the
  lookup. A call whose key has no measured answer (no source, a ``default`` match, a refused
  config) runs torch's op too wherever the kernel has one for the call
  (:func:`~tiletune.kernels.vendor.untuned_runs_vendor`): an untuned model is never slower than
  torch. The kernel's rule runs only where torch has no op (or for a plugin without one).

- CPU: the portable kernel's spec, run by its ``native`` implementation where the extension is
  built here (else the tiled PyTorch pipeline); its key is the kernel's own name.
- ``fused_attention`` gives ``(out, lse)`` (:func:`run_attention`): its spec's ``attend``; its
  backward kernel's ``gradients`` gives ``(dq, dk, dv)`` (:func:`run_attention_backward`).
- A backward kernel (``rms_norm_backward``) may give several tensors: :func:`run_kernel` returns them all.
- CUDA: the family's Triton implementation (its own kernel, its own key) where triton runs, else the
  portable one.
- Any other device (an NPU: torch_npu tensors): the portable pipeline, imported lazily as ever.
- float64 tensors (gradient checks): the kernel's reference formula, in float64; no config.
- A call's arguments that are not key dims (``rms_norm``'s ``eps``: the kernel's
  ``call_arguments``) go to :func:`run_kernel` as one mapping, ``arguments``, never among the dims:
  the key and its config are looked up without them, and whatever runs the call computes with them
  (the spec's ``run_with``, its ``reference_with`` for float64, torch's op by ``vendor_with``).
- Mixed dtypes, as autocast hands them over (bf16 or fp16 activations, fp32 weights), run in the
  first input's dtype (the activations'; the kernels accumulate in fp32): the output has it too,
  and each input's gradient comes back in the input's own dtype.

Called inside the operators' implementations, so at run time, with real tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

import torch

from tiletune.client.space import is_vendor
from tiletune.kernels import vendor
from tiletune.kernels.family import family_of
from tiletune.kernels.fused_attention import formula
from tiletune.kernels.fused_attention import vendor as attention_vendor
from tiletune.kernels.fused_attention.formula import AttentionSaved
from tiletune.kernels.fused_attention.portable import FusedAttentionSpec
from tiletune.kernels.fused_attention_backward import vendor as attention_backward_vendor
from tiletune.kernels.fused_attention_backward.formula import attention_backward
from tiletune.kernels.fused_attention_backward.portable import FusedAttentionBackwardSpec
from tiletune.kernels.launcher import Selection, select_config
from tiletune.kernels.native.spec import preferred_backend
from tiletune.kernels.ops.source import current_source
from tiletune.kernels.registry import get_kernel
from tiletune.kernels.spec import NO_ARGUMENTS, CallArguments, KernelOutput, KernelSpec, VendorOp, dtype_name
from tiletune.kernels.triton.space import TRITON_BACKEND


@cache
def implementation(kernel: str, device_kind: str) -> tuple[KernelSpec, str]:
    """The spec whose config a call of ``kernel`` on a ``device_kind`` device looks up, and the
    backend that runs it (see the module docstring). Decided once per process: the kernels, the
    native build and triton's presence are read once too."""
    family = family_of(kernel)
    triton = None if family is None else family.implementation(TRITON_BACKEND)
    if device_kind == "cuda" and triton is not None:  # a plugin may have no Triton implementation
        triton_spec = get_kernel(triton.kernel)
        if triton_spec.supports("cuda"):
            return triton_spec, TRITON_BACKEND
    spec = get_kernel(kernel)
    return spec, preferred_backend(spec, device_kind)


def _prepared(
    kernel: str, tensors: Sequence[torch.Tensor]
) -> tuple[tuple[torch.Tensor, ...], tuple[KernelSpec, str] | None]:
    """The call's inputs in the first's dtype, and the spec and backend that run them (None for
    float64: the kernel's reference formula)."""
    first = tensors[0].dtype  # mixed dtypes (autocast: bf16 activations, fp32 weights) run in the first's
    inputs = tuple(t if t.dtype == first else t.to(first) for t in tensors)
    if first == torch.float64:
        return inputs, None
    return inputs, implementation(kernel, inputs[0].device.type)


def vendor_to_run(
    selection: Selection, device_kind: str, backend: str, arguments: CallArguments = NO_ARGUMENTS
) -> VendorOp | None:
    """torch's op (computing with the call's ``arguments``) where a call runs it, else None: the
    answer is the vendor config, or there is no measured answer and torch's op is the untuned call's
    choice (:func:`~tiletune.kernels.vendor.untuned_vendor_op`)."""
    if is_vendor(selection.config):
        return vendor.vendor_op(selection.spec, selection.shape, device_kind, arguments)
    if selection.measured:
        return None
    return vendor.untuned_vendor_op(selection.spec, selection.shape, device_kind, backend, arguments)


def runs_vendor(selection: Selection, device_kind: str, backend: str) -> bool:
    """Whether a call runs torch's op (:func:`vendor_to_run`); the attention's paths ask this, since
    they run torch's attention with its log-sum-exp rather than the kernel's vendor op."""
    return vendor_to_run(selection, device_kind, backend) is not None


def contiguous(output: KernelOutput) -> KernelOutput:
    """A kernel's output (one tensor or several) with every tensor contiguous."""
    if isinstance(output, tuple):
        return tuple(t.contiguous() for t in output)
    return output.contiguous()


def run_kernel(
    kernel: str,
    tensors: Sequence[torch.Tensor],
    *,
    arguments: CallArguments = NO_ARGUMENTS,
    **dims: int | bool,
) -> KernelOutput:
    """``kernel`` on ``tensors`` (the order its spec's ``run`` takes) under the current source's config
    for their shape; ``dims`` complete the shape (key dims); ``arguments`` are the call's arguments
    of the kernel's ``call_arguments`` (``{"eps": 1e-5}``), not part of the key: the config is looked
    up without them, the kernel (or torch's op, or the float64 reference) computes with them;
    ``TypeError`` for one the kernel does not take. The result (one tensor, or a backward kernel's
    gradients) is contiguous (the fakes say so)."""
    inputs, runner = _prepared(kernel, tensors)
    if runner is None:
        spec = get_kernel(kernel)
        shape = spec.shape_of(inputs) | {k: int(v) for k, v in dims.items()}
        return contiguous(spec.reference_with(inputs, shape, arguments))
    spec, backend = runner
    selection = select_config(spec, *inputs, client=current_source(), dtype=None, runs_vendor=True, **dims)
    op = vendor_to_run(selection, inputs[0].device.type, backend, arguments)
    if op is not None:  # the launcher refuses a vendor answer torch has no op for
        return contiguous(op(inputs))
    return contiguous(spec.run_with(inputs, selection.config, selection.shape, backend, arguments))


def run_tensor_kernel(
    kernel: str,
    tensors: Sequence[torch.Tensor],
    *,
    arguments: CallArguments = NO_ARGUMENTS,
    **dims: int | bool,
) -> torch.Tensor:
    """:func:`run_kernel` for a kernel of one output tensor (``TypeError`` for one of several)."""
    output = run_kernel(kernel, tensors, arguments=arguments, **dims)
    if not isinstance(output, torch.Tensor):
        raise TypeError(f"{kernel} returns {len(output)} tensors, not one")
    return output


def run_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    *,
    causal: int,
    scale: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``fused_attention``'s ``(out, lse)``, as :func:`run_kernel` runs the others (``mask``, when
    given, is its fourth input; ``scale`` is the kernel's call argument)."""
    tensors = (q, k, v) if mask is None else (q, k, v, mask)
    inputs, runner = _prepared("fused_attention", tensors)
    if runner is None:
        get_kernel("fused_attention").shape_of(inputs)  # the inputs' checks, as the kernels have them
        out, lse = formula.attention(
            *inputs[:3], mask=None if mask is None else inputs[3], causal=causal, scale=scale
        )
        return out.contiguous(), lse.contiguous()
    spec, backend = runner
    if not isinstance(spec, FusedAttentionSpec):
        raise TypeError(f"{spec.name} is not an attention spec")
    selection = select_config(
        spec, *inputs, client=current_source(), dtype=None, runs_vendor=True, causal=causal
    )
    if runs_vendor(selection, inputs[0].device.type, backend):
        attend = attention_vendor.attention(selection.shape, inputs[0].device.type)
        assert attend is not None  # as the kernel's vendor op, which runs_vendor found
        out, lse = attend(inputs, scale)
    else:
        out, lse = spec.attend(inputs, selection.config, selection.shape, backend, scale)
    return out.contiguous(), lse.contiguous()


def run_attention_backward(
    saved: AttentionSaved, grad: torch.Tensor, grad_lse: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The attention's ``(dq, dk, dv)``: the ``fused_attention_backward`` kernel for the device (native on
    a CPU where the extension is built, Triton on CUDA, else the portable pipeline) under the current
    source's config for the forward's shape and dtype; float64 runs the formula. ``grad`` runs in
    ``out``'s dtype; ``lse`` stays float32. Contiguous results."""
    mask = () if saved.mask is None else (saved.mask,)
    inputs = (saved.q, saved.k, saved.v, saved.out, saved.lse, grad.to(saved.out.dtype), *mask)
    if saved.q.dtype == torch.float64:
        dq, dk, dv, _ = attention_backward(saved, grad, grad_lse, mask_grad=False)
        return dq.contiguous(), dk.contiguous(), dv.contiguous()
    spec, backend = implementation("fused_attention_backward", saved.q.device.type)
    if not isinstance(spec, FusedAttentionBackwardSpec):
        raise TypeError(f"{spec.name} is not an attention backward spec")
    dtype = dtype_name(saved.q.dtype)
    selection = select_config(
        spec, *inputs, client=current_source(), dtype=dtype, runs_vendor=grad_lse is None, causal=saved.causal
    )
    if grad_lse is None and runs_vendor(selection, saved.q.device.type, backend):
        backward = attention_backward_vendor.gradients(selection.shape, saved.q.device.type)
        assert backward is not None  # as the kernel's vendor op, which runs_vendor found
        dq, dk, dv = backward(inputs, saved.scale)
    else:  # torch's backward takes no gradient of lse: the tiled kernel does
        dq, dk, dv = spec.gradients(inputs, selection.config, selection.shape, backend, saved.scale, grad_lse)
    return dq.contiguous(), dk.contiguous(), dv.contiguous()
