"""A config's output against the kernel's reference: why it is wrong, or None when it is right.

Every output (one tensor, or a backward kernel's tuple) is compared in float32 on the CPU within
the dtype's ``atol``/``rtol``; NaN or Inf is always wrong. Imports torch and the spec's output type.
"""

from __future__ import annotations

import torch

from tiletune.kernels.spec import KernelOutput


def output_mismatch(actual: KernelOutput, expected: KernelOutput, atol: float, rtol: float) -> str | None:
    """Why ``actual`` is not ``expected`` within tolerance, or None when it is. Several outputs (a
    backward kernel's gradients) are compared one by one; a mismatch names the output's index."""
    if isinstance(expected, tuple) or isinstance(actual, tuple):
        got_all = actual if isinstance(actual, tuple) else (actual,)
        want_all = expected if isinstance(expected, tuple) else (expected,)
        if len(got_all) != len(want_all):
            return f"wrong number of outputs: {len(got_all)}, expected {len(want_all)}"
        for index, (got, want) in enumerate(zip(got_all, want_all, strict=True)):
            mismatch = _tensor_mismatch(got, want, atol, rtol)
            if mismatch is not None:
                return f"output {index}: {mismatch}"
        return None
    return _tensor_mismatch(actual, expected, atol, rtol)


def _tensor_mismatch(actual: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float) -> str | None:
    """Why one output tensor is not its reference within tolerance, or None when it is."""
    if actual.shape != expected.shape:
        return f"wrong output shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    got = actual.detach().to("cpu", torch.float32)
    want = expected.detach().to("cpu", torch.float32)
    if not torch.isfinite(got).all():
        return "output has NaN or Inf"
    excess = (got - want).abs() - (atol + rtol * want.abs())
    if (excess > 0).any():
        worst = int(torch.argmax(excess).item())
        got_value, want_value = got.flatten()[worst].item(), want.flatten()[worst].item()
        return (
            f"wrong result: {int((excess > 0).sum().item())} elements off "
            f"(worst at flat index {worst}: {got_value:.6g} vs {want_value:.6g})"
        )
    return None
