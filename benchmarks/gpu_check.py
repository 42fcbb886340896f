"""The GPU check: tuned Triton kernels against the hand-written rule and PyTorch's own, on one GPU.

Tunes ``triton_fused_attention`` for three shapes in fp16 and bf16 and
``triton_matmul`` for two, then re-measures, interleaved in one run per key,
the tuned config, the default rule's config and PyTorch's own op
(``scaled_dot_product_attention`` restricted to the flash backend;
``torch.matmul``). Prints one JSON document with the times, the ratios and the
issue's goals (on an H200: tuned attention within 1.2x of flash SDPA, and at
least 1.3x faster than the default's config). Meant to finish in under 5
minutes; ``benchmarks/gpu_check.sh`` runs it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812

from tiletune.kernels import get_kernel
from tiletune.kernels.declaration import Shape
from tiletune.kernels.device import get_device
from tiletune.tuner.measure.bench import BenchSettings, KernelBench, measure_interleaved
from tiletune.tuner.measure.tune import TuneOptions, tune

ATTENTION_SHAPES: list[Shape] = [
    {"batch": 4, "heads": 16, "seq_q": 1024, "seq_kv": 1024, "head_dim": 64, "causal": 0},
    {"batch": 2, "heads": 16, "seq_q": 4096, "seq_kv": 4096, "head_dim": 128, "causal": 1},
    {"batch": 1, "heads": 32, "seq_q": 8192, "seq_kv": 8192, "head_dim": 128, "causal": 0},
]
MATMUL_SHAPES: list[Shape] = [{"m": 4096, "n": 4096, "k": 4096}, {"m": 8192, "n": 1024, "k": 8192}]
DTYPES = ("float16", "bfloat16")
TUNE = BenchSettings(warmup_runs=2, min_samples=5, budget_s=0.05, max_samples=30, target_rel_ci=0.02)
FINAL = BenchSettings(warmup_runs=3, min_samples=20, budget_s=0.5, max_samples=200)


def torch_op(kernel: str, inputs: Sequence[torch.Tensor], shape: Shape) -> Callable[[], object]:
    """PyTorch's own op on the same inputs: flash SDPA, or torch.matmul."""
    if kernel == "triton_matmul":
        a, b = inputs
        return lambda: torch.matmul(a, b)
    q, k, v = inputs
    causal = bool(shape["causal"])

    def flash() -> object:
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return flash


def check_key(kernel: str, shape: Shape, dtype: str, trials: int) -> dict[str, Any]:
    """Tune one key, then measure tuned, default and PyTorch interleaved."""
    spec = get_kernel(kernel)
    device = get_device("cuda")
    started = time.monotonic()
    report = tune(spec, shape, dtype, device, TuneOptions(trials=trials, bench=TUNE))
    bench = KernelBench(spec, shape, dtype, device, settings=FINAL)
    contenders = {"tuned": bench.runner(report.best_config), "torch": torch_op(kernel, bench.inputs, shape)}
    if report.default_invalid is None and report.default_config != report.best_config:
        contenders["default"] = bench.runner(report.default_config)
    measured = dict(
        zip(contenders, measure_interleaved(list(contenders.values()), device, FINAL), strict=True)
    )
    tuned_ms = measured["tuned"].median_ms
    default_ms = measured["default"].median_ms if "default" in measured else tuned_ms
    return {
        "kernel": kernel,
        "shape": spec.canonical_shape(shape),
        "dtype": dtype,
        "tuned_config": report.best_config,
        "default_config": report.default_config,
        "default_invalid": report.default_invalid,
        "trials": report.counts,
        "times_ms": {name: m.median_ms for name, m in measured.items()},
        "tuned_over_torch": tuned_ms / measured["torch"].median_ms,
        "speedup_vs_default": default_ms / tuned_ms,
        "wall_s": time.monotonic() - started,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=24, help="trials per key (default 24)")
    args = parser.parse_args()
    started = time.monotonic()
    keys = [check_key("triton_fused_attention", s, d, args.trials) for s in ATTENTION_SHAPES for d in DTYPES]
    keys += [check_key("triton_matmul", s, "float16", args.trials) for s in MATMUL_SHAPES]
    attention = [k for k in keys if k["kernel"] == "triton_fused_attention"]
    summary = {
        "worst_attention_over_flash_sdpa": max(k["tuned_over_torch"] for k in attention),
        "median_attention_speedup_vs_default": statistics.median(k["speedup_vs_default"] for k in attention),
        "worst_matmul_over_torch": max(k["tuned_over_torch"] for k in keys if k["kernel"] == "triton_matmul"),
    }
    summary["goals"] = {
        "attention_within_1.2x_flash_sdpa": summary["worst_attention_over_flash_sdpa"] <= 1.2,
        "attention_ge_1.3x_default": min(k["speedup_vs_default"] for k in attention) >= 1.3,
    }
    document = {
        "benchmark": "gpu_check",
        "device": get_device("cuda").chip.name,
        "torch": torch.__version__,
        "keys": keys,
        "summary": summary,
        "wall_s": time.monotonic() - started,
    }
    json.dump(document, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
