"""What an untuned operator call should run: each kernel's rule against torch's own op, on this CPU.

For each built-in kernel at the keys a Llama-style model's step meets (the decoder of
``benchmarks/model/``: hidden 512, 8 query and 2 key/value heads of 64, SwiGLU 1408, at 1,024 and
2,048 tokens), the kernel's default config (its hand-written rule, on the implementation an
operator runs here: native where built) and torch's op are checked against the reference and
timed interleaved in one run (``tiletune bench``'s comparison). The ratio rule / torch is what
``KernelSpec.rule_beats_vendor`` is decided from: a kernel whose rule is faster at every key
measured runs it for calls nobody tuned; the others run torch's op
(``tiletune.kernels.vendor.untuned_runs_vendor``). The document says, per key, the ratio and what
the operators choose today, so a choice the figures contradict shows.

Then what an untuned operator call adds to the torch op it runs (``overhead``): each operator on
tensors so small that the op takes a few microseconds, against torch's op, interleaved
(``--rounds`` rounds of ``--calls`` calls each, under ``torch.no_grad``): ``torch.library``'s
dispatch, reading the call's shape, the config's selection. Medians of the rounds' µs per call.

Then the same cost where a model pays it (``cold``): each timed call right after a large
``torch.matmul`` (the decoder's MLP projection at 1,024 tokens, not timed), which leaves the
interpreter's code and data out of the caches: the ``matmul`` operator on the decoder's q
projection against ``torch.matmul`` (what an untuned call paid before an answer of torch's op ran
torch's function itself), and ``tiletune.nn.functional.linear`` against ``F.linear`` (what it pays
now: :mod:`tiletune.kernels.ops.torch_path`). Medians of ``--cold-samples`` interleaved pairs.

Prints one JSON document (``"benchmark": "untuned_choice"``); progress on stderr. Run from the
repository root: ``.venv/bin/python benchmarks/untuned_choice.py``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python benchmarks/untuned_choice.py`: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch.nn import functional

from tiletune.kernels.declaration import Shape
from tiletune.kernels.device import get_device
from tiletune.kernels.native.spec import preferred_backend
from tiletune.kernels.ops import configure
from tiletune.kernels.registry import get_kernel
from tiletune.kernels.vendor import untuned_runs_vendor
from tiletune.nn import functional as tiletune_functional
from tiletune.tuner.measure.bench import BenchSettings, KernelBench
from tiletune.tuner.measure.vendor_compare import compare_with_vendor

#: The decoder's sizes (``benchmarks/model/decoder.py``'s defaults).
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, MLP = 512, 8, 2, 64, 1408


def keys(tokens: int) -> list[tuple[str, Shape]]:
    """The keys of one step of the decoder at ``tokens`` tokens (one of each kind)."""
    attention = {
        "batch": 1,
        "heads": HEADS,
        "kv_heads": KV_HEADS,
        "seq_q": tokens,
        "seq_kv": tokens,
        "head_dim": HEAD_DIM,
        "causal": 1,
        "mask": 0,
    }
    rows = {"rows": tokens, "cols": HIDDEN}
    return [
        ("rms_norm", rows),
        ("rms_norm_backward", rows),
        ("matmul", {"m": tokens, "n": MLP, "k": HIDDEN, "a_transposed": 0, "b_transposed": 1}),
        ("matmul", {"m": tokens, "n": HIDDEN, "k": MLP, "a_transposed": 0, "b_transposed": 1}),
        ("fused_attention", attention),
        ("fused_attention_backward", attention),
        ("softmax", {"rows": HEADS * tokens // 8, "cols": tokens}),
        ("softmax_backward", {"rows": HEADS * tokens // 8, "cols": tokens}),
        ("add", {"n": tokens * HIDDEN}),
    ]


def measure_key(kernel: str, raw: Shape, settings: BenchSettings) -> dict[str, Any]:
    """The rule and torch's op of one key, interleaved: their medians, the ratio, today's choice."""
    spec = get_kernel(kernel)
    shape = spec.parse_shape(raw)
    device = get_device("cpu")
    bench = KernelBench(spec, shape, "float32", device, settings=settings)
    default = spec.default_config(shape, "float32", device.chip.limits)
    rows = compare_with_vendor(bench, [], default)
    rule = next(row for row in rows if row.is_default)
    vendor = next(row for row in rows if row.is_vendor)
    rule_ms = rule.measurement.median_ms if rule.measurement else None
    vendor_ms = vendor.measurement.median_ms if vendor.measurement else None
    backend = preferred_backend(spec, "cpu")
    return {
        "kernel": kernel,
        "shape": spec.canonical_shape(shape),
        "backend": backend,
        "rule_ms": rule_ms,
        "vendor_ms": vendor_ms,
        "rule_over_vendor": rule_ms / vendor_ms if rule_ms and vendor_ms else None,
        "untuned_runs": "vendor" if untuned_runs_vendor(spec, shape, "cpu", backend) else "rule",
        "invalid": rule.invalid or vendor.invalid,
    }


Call = Callable[[], object]


def overhead_pairs() -> dict[str, tuple[Call, Call]]:
    """Each operator's call and torch's op's, on tiny tensors."""
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(8, 8, generator=generator), torch.randn(8, 8, generator=generator)
    x, y = torch.randn(64, generator=generator), torch.randn(64, generator=generator)
    rows = torch.randn(8, 64, generator=generator)
    ops = torch.ops.tiletune
    return {
        "matmul": (lambda: ops.matmul(a, b), lambda: torch.matmul(a, b)),
        "add": (lambda: ops.add(x, y), lambda: torch.add(x, y)),
        "softmax": (lambda: ops.softmax(rows), lambda: torch.softmax(rows, -1)),
    }


def per_call_us(call: Call, calls: int) -> float:
    """µs per call over ``calls`` back-to-back calls."""
    started = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - started) / calls * 1e6


def overhead(ours: Call, theirs: Call, rounds: int, calls: int) -> dict[str, float]:
    """The two calls interleaved round by round: medians of µs per call, and the difference."""
    for call in (ours, theirs):
        per_call_us(call, calls)  # warm-up
    samples: dict[str, list[float]] = {"tiletune_us": [], "torch_us": []}
    for _ in range(rounds):
        samples["tiletune_us"].append(per_call_us(ours, calls))
        samples["torch_us"].append(per_call_us(theirs, calls))
    medians = {name: statistics.median(values) for name, values in samples.items()}
    return {**medians, "added_us": medians["tiletune_us"] - medians["torch_us"]}


def cold_pairs() -> dict[str, tuple[Call, Call]]:
    """The untuned operator and ``tiletune.nn.functional.linear`` against torch's, at the decoder's
    q projection (1,024 tokens)."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(1, 1024, HIDDEN, generator=generator)
    weight = torch.randn(HEADS * HEAD_DIM, HIDDEN, generator=generator)
    rows, transposed = x.reshape(-1, HIDDEN), weight.t()
    return {
        "matmul_operator": (
            lambda: torch.ops.tiletune.matmul(rows, transposed),
            lambda: torch.matmul(rows, transposed),
        ),
        "linear_function": (
            lambda: tiletune_functional.linear(x, weight),
            lambda: functional.linear(x, weight),
        ),
    }


def cold_overhead(ours: Call, theirs: Call, samples: int) -> dict[str, float]:
    """Each call timed once right after a large matmul (not timed), the two alternating: medians of
    µs per call, and the difference."""
    generator = torch.Generator().manual_seed(2)
    a, b = torch.randn(1024, HIDDEN, generator=generator), torch.randn(HIDDEN, MLP, generator=generator)
    times: dict[str, list[float]] = {"tiletune_us": [], "torch_us": []}
    for index in range(samples + 2):  # the first two warm up
        for name, call in (("tiletune_us", ours), ("torch_us", theirs))[:: 1 if index % 2 else -1]:
            torch.matmul(a, b)
            started = time.perf_counter()
            call()
            if index >= 2:
                times[name].append((time.perf_counter() - started) * 1e6)
    medians = {name: statistics.median(values) for name, values in times.items()}
    return {**medians, "added_us": medians["tiletune_us"] - medians["torch_us"]}


def _rule_faster(measured: list[dict[str, Any]], kernel: str) -> bool:
    """Whether ``kernel``'s rule was faster than torch's op at every key of it measured."""
    ratios = [k["rule_over_vendor"] for k in measured if k["kernel"] == kernel]
    return all(ratio is not None and ratio < 1 for ratio in ratios)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, nargs="+", default=[1024, 2048], help="default 1024 2048")
    parser.add_argument("--budget-s", type=float, default=0.4, help="seconds per candidate (default 0.4)")
    parser.add_argument("--rounds", type=int, default=21, help="overhead: interleaved rounds (default 21)")
    parser.add_argument("--calls", type=int, default=500, help="overhead: calls per round (default 500)")
    parser.add_argument("--cold-samples", type=int, default=300, help="cold: pairs timed (default 300)")
    args = parser.parse_args(argv)
    configure()  # no source: every operator call is untuned
    settings = BenchSettings(budget_s=args.budget_s)
    measured = []
    for tokens in args.tokens:
        for kernel, shape in keys(tokens):
            print(f"untuned_choice: {kernel} {shape}", file=sys.stderr, flush=True)
            measured.append(measure_key(kernel, shape, settings))
    kernels = sorted({k["kernel"] for k in measured})
    print("untuned_choice: the operators' per-call cost", file=sys.stderr, flush=True)
    with torch.no_grad():
        costs = {name: overhead(*pair, args.rounds, args.calls) for name, pair in overhead_pairs().items()}
        print("untuned_choice: the per-call cost after a large matmul", file=sys.stderr, flush=True)
        cold = {name: cold_overhead(*pair, args.cold_samples) for name, pair in cold_pairs().items()}
    document = {
        "benchmark": "untuned_choice",
        "chip": get_device("cpu").chip.name,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "keys": measured,
        "rule_faster_at_every_key": [kernel for kernel in kernels if _rule_faster(measured, kernel)],
        "overhead": {"rounds": args.rounds, "calls": args.calls, "operators": costs},
        "cold": {"samples": args.cold_samples, "calls": cold},
    }
    json.dump(document, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
