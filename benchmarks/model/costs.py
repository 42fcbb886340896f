"""Where a step on tiletune's operators spends its time: each operator's share, and the lookups'.

- :func:`operator_shares`: one step under ``torch.profiler`` (CPU); per ``tiletune::<operator>``
  event, its calls, its self CPU time and its total CPU time (its own and the torch ops it ran),
  each also as a share of the profile's CPU time (the sum of every event's self time); for a
  training step, each operator's share per phase (forward, backward, optimizer).
- :func:`lookup_cost`: how many config lookups (``source.get`` calls) one step makes, counted by
  a source that forwards to the real one (the second step under it: the first decides, once, which
  calls run torch's function itself, :mod:`tiletune.kernels.ops.torch_path`), and what one call
  costs on the step's own keys (every key the step asked, each asked in turn, a hit once
  prefetched); their product against the step's
  median time is the lookups' share. The same for the whole config selection of an operator call
  (:func:`tiletune.kernels.launcher.select_config`: reading the shape, the lookup, the checked
  config), on the step's own tensors' shapes.
"""

from __future__ import annotations

import functools
import itertools
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.model.steps import PHASE_PREFIX, Variant
from tiletune.kernels.launcher import ConfigSource, TunedConfig, select_config
from tiletune.kernels.registry import get_kernel

#: The profiler's name prefix of tiletune's operators.
OPERATOR_PREFIX = "tiletune::"
#: Calls per timing batch, and batches, when a lookup's cost is measured.
CALLS_PER_BATCH = 2_000
BATCHES = 7

Key = tuple[str, tuple[tuple[str, int], ...], str]


def operator_shares(variant: Variant, kind: str, tokens: torch.Tensor) -> dict[str, Any]:
    """One ``kind`` step of ``variant`` under the profiler: per operator, calls, self and total CPU
    ms and their shares of the profile's CPU time."""
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        variant.step(kind, tokens)
    events = profiler.key_averages()
    cpu_us = sum(event.self_cpu_time_total for event in events)
    operators = {
        event.key.removeprefix(OPERATOR_PREFIX): {
            "calls": event.count,
            "self_cpu_ms": event.self_cpu_time_total / 1e3,
            "total_cpu_ms": event.cpu_time_total / 1e3,
            "self_share": event.self_cpu_time_total / cpu_us,
            "total_share": event.cpu_time_total / cpu_us,
        }
        for event in events
        if event.key.startswith(OPERATOR_PREFIX)
    }
    return {
        "profile_cpu_ms": cpu_us / 1e3,
        "operators": operators,
        "self_share": sum(op["self_share"] for op in operators.values()),
        "total_share": sum(op["total_share"] for op in operators.values()),
        "phases": _phase_shares(profiler.events(), cpu_us),
    }


def _phase_shares(events: Any, cpu_us: float) -> dict[str, dict[str, float]]:
    """Per phase of a training step (its :data:`PHASE_PREFIX` ranges: forward, backward, optimizer),
    each operator's total CPU time there as a share of the profile's: ``matmul`` under ``backward``
    is matmul's backward (its two transposed calls). Empty for an inference step (no phases)."""
    phases = [
        (event.name.removeprefix(PHASE_PREFIX), event.time_range)
        for event in events
        if event.name.startswith(PHASE_PREFIX)
    ]
    shares: dict[str, dict[str, float]] = {phase: {} for phase, _ in phases}
    for event in events:
        if not event.name.startswith(OPERATOR_PREFIX):
            continue
        name = event.name.removeprefix(OPERATOR_PREFIX)
        for phase, span in phases:
            if span.start <= event.time_range.start <= span.end:
                shares[phase][name] = shares[phase].get(name, 0.0) + event.cpu_time_total / cpu_us
    return shares


class CountingSource:
    """A config source that forwards to ``inner`` and counts each key asked."""

    def __init__(self, inner: ConfigSource) -> None:
        self.inner = inner
        self.calls: Counter[Key] = Counter()

    def get(self, kernel: str, shape: Mapping[str, int], /, *, dtype: str) -> TunedConfig:
        """``inner``'s answer, counted."""
        self.calls[(kernel, tuple(shape.items()), dtype)] += 1
        return self.inner.get(kernel, shape, dtype=dtype)


def _ns_per_call(calls: Iterator[Callable[[], object]], batch: int) -> float:
    """The median over :data:`BATCHES` of the ns per call of the next of ``calls`` (batches of ``batch``)."""
    per_batch = []
    for _ in range(BATCHES):
        started = time.perf_counter_ns()
        for _ in range(batch):
            next(calls)()
        per_batch.append((time.perf_counter_ns() - started) / batch)
    return statistics.median(per_batch)


def _selection_call(source: ConfigSource, key: Key) -> Callable[[], object]:
    """``select_config`` of ``key`` under ``source``, on the kernel's own inputs for the key's shape
    (its layouts, kv heads and mask as the key says)."""
    kernel, items, dtype = key
    shape = dict(items)
    spec = get_kernel(kernel)
    tensors = spec.make_inputs(spec.parse_shape(shape), dtype, torch.device("cpu"))
    if "causal" in shape:
        return lambda: select_config(spec, *tensors, client=source, causal=shape["causal"])
    return lambda: select_config(spec, *tensors, client=source)


def lookup_cost(variant: Variant, kind: str, tokens: torch.Tensor, step_ms: float) -> dict[str, Any]:
    """Lookups per ``kind`` step of ``variant`` and their share of ``step_ms`` (see the module).

    A call's cost includes the timing loop's own (an upper bound: the step's keys are asked in turn).
    """
    source = variant.source
    assert source is not None
    counting = CountingSource(source)
    variant.source = counting  # the step's own scope asks it
    try:
        variant.step(kind, tokens)  # a new source: each call layout's path is decided again
        counting.calls.clear()
        variant.step(kind, tokens)
    finally:
        variant.source = source
    asked = [(kernel, dict(items), dtype) for kernel, items, dtype in counting.calls]
    calls = sum(counting.calls.values())
    gets = itertools.cycle(
        [functools.partial(source.get, kernel, shape, dtype=dtype) for kernel, shape, dtype in asked]
    )
    selections = itertools.cycle([_selection_call(source, key) for key in counting.calls])
    get_ns = _ns_per_call(gets, CALLS_PER_BATCH)
    select_ns = _ns_per_call(selections, CALLS_PER_BATCH // 4)
    matches = Counter(getattr(source.get(k, shape, dtype=d), "match", "unknown") for k, shape, d in asked)
    return {
        "calls_per_step": calls,
        "distinct_keys": len(asked),
        "matches": dict(matches),
        "get_ns_per_call": get_ns,
        "select_ns_per_call": select_ns,
        "get_share_of_step": calls * get_ns / (step_ms * 1e6),
        "select_share_of_step": calls * select_ns / (step_ms * 1e6),
    }
