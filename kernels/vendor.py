"""A kernel's vendor implementation: torch's own op, untiled, a candidate like any config.

A kernel that declares ``has_vendor`` (every built-in family; a plugin may) has, besides its tiled
configs, :data:`~tiletune.client.space.VENDOR_CONFIG`: torch's op for the call (``torch.add``,
``torch.softmax``, ``F.rms_norm``, ``torch.matmul``, torch's fused attention and the backwards
torch computes for them). Its spec's ``vendor(shape, device_kind)`` gives it as a callable on the
kernel's inputs (as ``run`` takes them) returning what ``run`` returns, or ``None`` where torch has
no op for that shape on that device (each family's ``vendor`` module says where).

- :func:`run_config` runs any config of a kernel: the vendor config by torch's op, the others by
  the spec's ``run``. The bench, the launcher and the operators run configs through it, so torch's
  op is measured in the same interleaved runs as the tiles, judged with them, and launched with
  nothing added beyond the lookup.
- :func:`untuned_runs_vendor` is the operators' rule for a call whose key has no measured answer.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tiletune.client.space import is_vendor
from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.errors import DeviceUnavailableError
from tiletune.kernels.spec import NO_ARGUMENTS, CallArguments, KernelOutput, KernelSpec, VendorOp


def vendor_op(
    spec: KernelSpec, shape: Shape, device_kind: str, arguments: CallArguments = NO_ARGUMENTS
) -> VendorOp | None:
    """torch's own op for ``spec``'s calls of ``shape`` on a ``device_kind`` device, computing with
    the call's ``arguments`` (``KernelSpec.vendor_with``; the kernel's defaults when none are
    given), or None (the kernel declares none, or torch has none there)."""
    return spec.vendor_with(shape, device_kind, arguments) if spec.has_vendor else None


def run_config(
    spec: KernelSpec, inputs: Sequence[torch.Tensor], config: Config, shape: Shape, backend: str
) -> KernelOutput:
    """``spec`` on ``inputs`` under ``config``: torch's op for the vendor config, else ``spec.run``
    with the implementation ``backend``. Raises :class:`DeviceUnavailableError` for the vendor
    config where torch has no op for the call (a bench records it as the config's failure)."""
    if not is_vendor(config):
        return spec.run(inputs, config, shape, backend)
    op = vendor_op(spec, shape, inputs[0].device.type)
    if op is None:
        raise DeviceUnavailableError(
            f"{spec.name}: torch has no op for {spec.canonical_shape(shape)} on {inputs[0].device.type}"
        )
    return op(inputs)


def untuned_vendor_op(
    spec: KernelSpec, shape: Shape, device_kind: str, backend: str, arguments: CallArguments = NO_ARGUMENTS
) -> VendorOp | None:
    """What an operator call with no measured answer for its key runs: torch's op (returned, with
    the call's ``arguments``) wherever the kernel has one for the call, so a patched model is never
    slower than torch before it is tuned; None (the kernel's rule) where there is none, or where the
    kernel's figures show the rule faster than torch's op on the implementation ``backend``
    (``KernelSpec.rule_beats_vendor``)."""
    if backend in spec.rule_beats_vendor:
        return None
    return vendor_op(spec, shape, device_kind, arguments)


def untuned_runs_vendor(spec: KernelSpec, shape: Shape, device_kind: str, backend: str) -> bool:
    """Whether an operator call with no measured answer runs torch's op (True) or the kernel's rule
    (False): :func:`untuned_vendor_op` is not None."""
    return untuned_vendor_op(spec, shape, device_kind, backend) is not None
