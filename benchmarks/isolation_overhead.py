"""What isolating trials costs: a config's ``evaluate`` in a warm trial process against in process.

For the portable ``add`` kernel on the CPU, two trials (JSON on stdout):

- ``tiny``: ``n=1024``, an evaluate of well under a millisecond (the pipe's round trip dominates);
- ``10ms``: ``n`` doubled until an in-process evaluate takes about ``--target-ms`` (10 ms).

Each evaluate makes a fixed number of runs (one checked run, one warm-up, five samples: no budget
or confidence stop, no pruning), so both paths do the same work. The two paths alternate
(in process, isolated, isolated, in process, ...) over ``--repeats`` trials, cycling over four
tile sizes; each trial's wall time is taken around ``evaluate`` in this process. Reported per
case: medians and p10/p90 of both paths (ms), the median paired overhead (isolated minus the
in-process trial next to it, ms) and its ratio to the in-process median (the goal: ≤ 0.10 for a
10 ms trial). ``round_trip``: a ``check`` refused before any run, in µs, both paths: the fixed cost
of a call through the pipe. Also ``start_s``: the first isolated bench (spawn, imports, inputs,
the default's check). Before each timed trial both processes idle for ``IDLE_S`` (untimed), so the
thread pool one path woke does not spin against the other's trial on a small machine.

Run from the repository root: ``.venv/bin/python -m benchmarks.isolation_overhead`` (``--repeats 200``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from typing import Any

from tiletune.kernels.device import CpuDevice
from tiletune.kernels.registry import get_kernel
from tiletune.tuner.measure.bench import BenchSettings, KernelBench
from tiletune.tuner.measure.isolation import TrialPool

#: A fixed amount of work per evaluate: the checked run, one warm-up, five samples (each sample one
#: launch where the bench has a least sample time: a tiny trial stays tiny).
_FIXED_FIELDS: dict[str, Any] = {
    "warmup_runs": 1,
    "min_samples": 5,
    "max_samples": 5,
    "budget_s": 60.0,
    "target_rel_ci": 0.0,
    "prune_ratio": None,
    "settle_s": 0.0,
    "min_sample_ms": 0.0,
}
FIXED = BenchSettings(
    **{f.name: _FIXED_FIELDS[f.name] for f in dataclasses.fields(BenchSettings) if f.name in _FIXED_FIELDS}
)
#: A config every chip refuses before running it: its check is the bare round trip.
REFUSED = {"tile_size": 256, "buffer_num": 64, "pipeline_depth": 1}
IDLE_S = 0.005
TILES = (256, 1024, 4096, 16384)


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _summary(values_ms: list[float]) -> dict[str, float]:
    return {
        "median_ms": statistics.median(values_ms),
        "p10_ms": _quantile(values_ms, 0.1),
        "p90_ms": _quantile(values_ms, 0.9),
    }


def _wall_ms(bench: KernelBench, config: dict[str, int]) -> float:
    time.sleep(IDLE_S)
    start = time.perf_counter()
    result = bench.evaluate(config)
    elapsed_ms = (time.perf_counter() - start) * 1e3
    if not result.ok:
        raise RuntimeError(f"{config}: {result.error or result.invalid}")
    return elapsed_ms


def _config(n: int, tile: int) -> dict[str, int]:
    return {"tile_size": min(tile, max(256, n)), "buffer_num": 2, "pipeline_depth": 2}


def round_trip(pool: TrialPool, repeats: int) -> dict[str, Any]:
    """The bare cost of a call: ``check`` of a config refused at once, isolated and in process (µs)."""
    spec, device, shape = get_kernel("add"), CpuDevice(), {"n": 1024}
    local = KernelBench(spec, shape, "float32", device, "torch", FIXED)
    isolated = pool.bench(spec, shape, "float32", device, backend="torch", settings=FIXED)
    result: dict[str, Any] = {}
    for name, bench in (("in_process", local), ("isolated", isolated)):
        times_us = []
        for _ in range(repeats):
            start = time.perf_counter()
            if bench.check(REFUSED) is None:
                raise RuntimeError(f"{REFUSED} was not refused")
            times_us.append((time.perf_counter() - start) * 1e6)
        result[name] = {k.replace("_ms", "_us"): v for k, v in _summary(times_us).items()}
    return result


def calibrated_n(target_ms: float) -> int:
    """The smallest power-of-two ``n`` whose in-process evaluate takes at least ``target_ms``."""
    spec, n = get_kernel("add"), 1 << 12
    while n < 1 << 26:
        bench = KernelBench(spec, {"n": n}, "float32", CpuDevice(), "torch", FIXED)
        if statistics.median(_wall_ms(bench, _config(n, 4096)) for _ in range(5)) >= target_ms:
            return n
        n *= 2
    return n


def case(pool: TrialPool, n: int, repeats: int) -> dict[str, Any]:
    """Interleaved in-process and isolated evaluates of ``add`` at ``n`` (see the module docstring)."""
    spec, device, shape = get_kernel("add"), CpuDevice(), {"n": n}
    local = KernelBench(spec, shape, "float32", device, "torch", FIXED)
    isolated = pool.bench(spec, shape, "float32", device, backend="torch", settings=FIXED)
    for tile in TILES:  # first calls on both sides
        _wall_ms(local, _config(n, tile))
        _wall_ms(isolated, _config(n, tile))
    local_ms: list[float] = []
    isolated_ms: list[float] = []
    for index in range(repeats):
        config = _config(n, TILES[index % len(TILES)])
        pair = (local, isolated) if index % 2 == 0 else (isolated, local)
        times = {id(bench): _wall_ms(bench, config) for bench in pair}
        local_ms.append(times[id(local)])
        isolated_ms.append(times[id(isolated)])
    overhead = [iso - loc for iso, loc in zip(isolated_ms, local_ms, strict=True)]
    in_process = statistics.median(local_ms)
    return {
        "n": n,
        "trials": repeats,
        "in_process": _summary(local_ms),
        "isolated": _summary(isolated_ms),
        "overhead": _summary(overhead),
        "overhead_ratio": statistics.median(overhead) / in_process,
    }


def main() -> None:
    """Print the JSON report."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeats", type=int, default=200, help="trials per path and case (default 200)")
    parser.add_argument(
        "--target-ms", type=float, default=10.0, help="the long case's trial time (default 10)"
    )
    args = parser.parse_args()
    pool = TrialPool()
    try:
        start = time.perf_counter()
        pool.bench(get_kernel("add"), {"n": 1024}, "float32", CpuDevice(), backend="torch", settings=FIXED)
        start_s = time.perf_counter() - start
        report = {
            "benchmark": "isolation_overhead",
            "kernel": "add",
            "settings": {"warmup_runs": FIXED.warmup_runs, "samples": FIXED.min_samples},
            "start_s": start_s,
            "round_trip": round_trip(pool, args.repeats),
            "tiny": case(pool, 1024, args.repeats),
            "10ms": case(pool, calibrated_n(args.target_ms), args.repeats),
        }
    finally:
        pool.close()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
