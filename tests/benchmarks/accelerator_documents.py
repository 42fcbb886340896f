"""Small documents shaped like ``isolation_overhead``'s, ``cpp_lookup``'s and ``compile_time_tiles``' JSON."""

from __future__ import annotations

from typing import Any


def _spread_ms(median: float) -> dict[str, float]:
    """A median with its p10 and p90 (ms), as ``isolation_overhead`` summarises a path."""
    return {"median_ms": median, "p10_ms": median * 0.9, "p90_ms": median * 1.2}


def _isolation_case(n: int, in_process_ms: float, isolated_ms: float) -> dict[str, Any]:
    overhead_ms = isolated_ms - in_process_ms
    return {
        "n": n,
        "trials": 20,
        "in_process": _spread_ms(in_process_ms),
        "isolated": _spread_ms(isolated_ms),
        "overhead": _spread_ms(overhead_ms),
        "overhead_ratio": overhead_ms / in_process_ms,
    }


ISOLATION_OVERHEAD: dict[str, Any] = {
    "benchmark": "isolation_overhead",
    "kernel": "add",
    "settings": {"warmup_runs": 1, "samples": 5},
    "start_s": 1.8,
    "round_trip": {
        "in_process": {"median_us": 2.1, "p10_us": 1.9, "p90_us": 2.6},
        "isolated": {"median_us": 95.0, "p10_us": 80.0, "p90_us": 130.0},
    },
    "tiny": _isolation_case(1024, 0.12, 0.45),
    "10ms": _isolation_case(1 << 21, 10.2, 10.9),
}


def _lookup_ns(median: float, expected: float = 1.0) -> dict[str, float]:
    """One kind of lookup as ``cpp_lookup``'s program reports it."""
    return {
        "median_ns": median,
        "p10_ns": median * 0.9,
        "p90_ns": median * 1.3,
        "p99_ns": median * 2.0,
        "min_ns": median * 0.8,
        "answered_as_expected": expected,
    }


CPP_LOOKUP: dict[str, Any] = {
    "benchmark": "cpp_lookup",
    "entries": 1000,
    "keys": 100,
    "batch": 10_000,
    "rounds": 200,
    "load_ms": 12.5,
    "exact_same_key": _lookup_ns(40.0),
    "exact": _lookup_ns(45.0),
    "exact_via_client": _lookup_ns(52.0),
    "nearest": _lookup_ns(900.0, 0.98),
    "default": _lookup_ns(30.0),
    "goal_hit_ns": 100,
    "hit_within_goal": True,
    "hit_in_turn_within_goal": True,
}


def _tiles_config(tiles: tuple[int, int, int], compile_ms: float, speedup: float) -> dict[str, Any]:
    """One config of a ``compile_time_tiles`` shape: both builds and torch's op."""
    return {
        "tiles": dict(zip(("tile_m", "tile_n", "tile_k"), tiles, strict=True)),
        "compile_time": {**_spread_ms(compile_ms), "samples": 30},
        "run_time": {**_spread_ms(compile_ms * speedup), "samples": 30},
        "torch_matmul": {**_spread_ms(compile_ms * 0.6), "samples": 30},
        "static_speedup": speedup,
        "gflops_compile_time": 20.0,
    }


def _tiles_shape(size: int, scale_ms: float) -> dict[str, Any]:
    configs = [
        _tiles_config((32, 64, 256), scale_ms, 1.3),
        _tiles_config((64, 32, 128), scale_ms * 1.1, 1.2),
        _tiles_config((64, 64, 64), scale_ms * 1.2, 1.4),  # the default, last
    ]
    best = configs[0]
    return {
        "shape": {"m": size, "n": size, "k": size},
        "configs": configs,
        "best_compile_time": {"tiles": best["tiles"], **best["compile_time"]},
        "best_run_time": {"tiles": configs[1]["tiles"], **configs[1]["run_time"]},
        "best_speedup": 1.2,
    }


def _ahead_run(workers: int, wait_s: float) -> dict[str, Any]:
    measuring_s, other_s = 6.0, 1.5
    wall_s = measuring_s + wait_s + other_s
    return {
        "build_workers": workers,
        "load_average_1m": 0.4,
        "trials": 16,
        "builds": 15,
        "build_s": 7.5,
        "job_wall_s": wall_s,
        "measuring_s": measuring_s,
        "build_wait_s": wait_s,
        "other_s": other_s,
        "busy": measuring_s / wall_s,
        "busy_while_measuring": measuring_s / (measuring_s + wait_s),
        "ready_when_measured": 12 if workers else 0,
        "waits": 3 if workers else 15,
    }


COMPILE_TIME_TILES: dict[str, Any] = {
    "benchmark": "compile_time_tiles",
    "threads": 1,
    "tiles": [_tiles_shape(256, 1.5), _tiles_shape(500, 11.0)],
    "build_ahead": {"with_pool": _ahead_run(1, 0.8), "without_pool": _ahead_run(0, 7.0)},
}
