"""The GPU check's family part: every family's Triton implementation on CUDA, forward and backward.

For each built-in family with a Triton implementation (found from the families, not listed: a new
family is checked with no edit here), at one shape per family, in float16 and bfloat16:

- the Triton kernel under its default rule's config, checked against the family's reference
  (the bench's own check: the tolerance a worker applies) and timed, interleaved with torch's op
  where the family has one on CUDA (``vendor_op(spec, shape, "cuda")``; the attention's forward is
  compared with flash SDPA by the check's ``keys`` part instead);
- the key tuned (``tune``, a few trials): its answer, whether that is torch's op, its speedup.

Imported by :mod:`benchmarks.gpu_check`, which puts both parts in its document.
"""

from __future__ import annotations

import time
from typing import Any

from tiletune.client.space import vendor_config
from tiletune.kernels.declaration import Shape
from tiletune.kernels.device import Device
from tiletune.kernels.family import builtin_families
from tiletune.kernels.registry import get_kernel
from tiletune.kernels.triton.space import TRITON_BACKEND
from tiletune.kernels.vendor import vendor_op
from tiletune.tuner.measure.bench import BenchSettings, KernelBench
from tiletune.tuner.measure.tune import TuneOptions, tune

_ATTENTION = {"batch": 2, "heads": 16, "kv_heads": 16, "seq_q": 2048, "seq_kv": 2048, "head_dim": 128}
#: One CUDA-sized shape per set of dim names (a family's backward carries its forward's dims).
SHAPES: dict[tuple[str, ...], Shape] = {
    ("n",): {"n": 1 << 24},
    ("rows", "cols"): {"rows": 8192, "cols": 4096},
    ("m", "n", "k"): {"m": 4096, "n": 4096, "k": 4096, "a_transposed": 0, "b_transposed": 0},
    ("batch", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim", "causal", "mask"): {
        **_ATTENTION,
        "causal": 1,
        "mask": 0,
    },
}
DTYPES = ("float16", "bfloat16")


def triton_kernels() -> list[str]:
    """The Triton implementations' kernel names, family by family."""
    found = (family.implementation(TRITON_BACKEND) for family in builtin_families().values())
    return [implementation.kernel for implementation in found if implementation is not None]


def shape_for(kernel: str) -> Shape:
    """The check's shape for ``kernel``: the one for its dims (the leading ones for matmul's layout)."""
    dims = tuple(d.name for d in get_kernel(kernel).dims)
    for names, shape in SHAPES.items():
        if dims[: len(names)] == names:
            return {name: value for name, value in shape.items() if name in dims}
    raise KeyError(f"no check shape for {kernel}'s dims {dims}")


def check_implementation(
    kernel: str, dtype: str, device: Device, settings: BenchSettings, shape: Shape | None = None
) -> dict[str, Any]:
    """One Triton kernel's default config on ``device`` (at ``shape``, else the check's): correct,
    and its time against torch's op."""
    spec, shape = get_kernel(kernel), shape or shape_for(kernel)
    bench = KernelBench(spec, shape, dtype, device, backend=TRITON_BACKEND, settings=settings)
    default = spec.default_config(shape, dtype, device.chip.limits)
    result: dict[str, Any] = {"kernel": kernel, "shape": spec.canonical_shape(shape), "dtype": dtype}
    rejected = bench.check(default)
    if rejected is not None:
        return {**result, "correct": False, "error": rejected.error or rejected.invalid}
    result["correct"] = True
    configs = [default]
    if vendor_op(spec, shape, device.kind) is not None:
        configs.append(vendor_config())
    measured = bench.compare(configs)
    result["times_ms"] = dict(zip(("triton", "torch"), (m.median_ms for m in measured), strict=False))
    if len(measured) == 2:
        result["triton_over_torch"] = measured[0].median_ms / measured[1].median_ms
    return result


def tuned_key(
    kernel: str, device: Device, trials: int, settings: BenchSettings, shape: Shape | None = None
) -> dict[str, Any]:
    """``kernel``'s key at ``shape`` (else the check's) in float16, tuned: what answers it, and how fast."""
    spec, shape = get_kernel(kernel), shape or shape_for(kernel)
    started = time.monotonic()
    report = tune(spec, shape, "float16", device, TuneOptions(trials=trials, bench=settings))
    return {
        "kernel": kernel,
        "shape": spec.canonical_shape(shape),
        "dtype": "float16",
        "best_config": report.best_config,
        "implementation": report.implementation,
        "speedup_vs_default": report.speedup_vs_default,
        "speedup_vs_vendor": report.speedup_vs_vendor,
        "counts": report.counts,
        "wall_s": time.monotonic() - started,
    }


def family_check(device: Device, trials: int, settings: BenchSettings) -> dict[str, Any]:
    """Both parts for every Triton kernel; a kernel that raises is reported with its error."""
    implementations: list[dict[str, Any]] = []
    tuned: list[dict[str, Any]] = []
    for kernel in triton_kernels():
        for dtype in DTYPES:
            try:
                implementations.append(check_implementation(kernel, dtype, device, settings))
            except Exception as error:  # report, and go on with the others
                implementations.append(
                    {"kernel": kernel, "dtype": dtype, "error": f"{type(error).__name__}: {error}"}
                )
        try:
            tuned.append(tuned_key(kernel, device, trials, settings))
        except Exception as error:
            tuned.append({"kernel": kernel, "error": f"{type(error).__name__}: {error}"})
    return {
        "implementations": implementations,
        "tuned": tuned,
        "goals": {
            "every_triton_kernel_correct": all(i.get("correct") for i in implementations),
            "every_key_tuned": all("error" not in t for t in tuned),
            "no_tuned_key_slower_than_torch": all((t.get("speedup_vs_vendor") or 1.0) >= 1.0 for t in tuned),
        },
    }
