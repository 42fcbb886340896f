"""Small documents shaped like each benchmark's JSON output: two or three keys, levels or pages each."""

from __future__ import annotations

from typing import Any

from tests.benchmarks.accelerator_documents import COMPILE_TIME_TILES, CPP_LOOKUP, ISOLATION_OVERHEAD


def _times(median: float) -> dict[str, Any]:
    """One measurement as ``tuning_quality`` reports it."""
    return {
        "median_ms": median,
        "p10_ms": median * 0.95,
        "p90_ms": median * 1.1,
        "min_ms": median * 0.9,
        "samples": 20,
        "pruned": False,
    }


def _fractions(median: float, worst: float) -> dict[str, Any]:
    return {"median": median, "worst": worst}


SEARCH_REPLAY: dict[str, Any] = {
    "benchmark": "search_replay",
    "seeds": 2,
    "spaces": {
        name: {
            "valid_configs": 4362,
            "strategies": {
                "tpe": {
                    "fraction": {
                        "1%": _fractions(0.75, 0.6),
                        "5%": _fractions(1.0, 0.86),
                        "10%": _fractions(1.0, 1.0),
                    }
                },
                "random": {
                    "fraction": {
                        "1%": _fractions(0.63, 0.56),
                        "5%": _fractions(0.77, 0.67),
                        "10%": _fractions(0.85, 0.67),
                    }
                },
            },
        }
        for name in ("convolution_A100", "gemm_RTX_Titan")
    },
}

SPACE_BASINS: dict[str, Any] = {
    "benchmark": "space_basins",
    "reach": 0.97,
    "spaces": {
        "convolution_A100": {
            "one_knob": {"share_climbing_within_reach": 0.092},
            "two_knobs": {"share_climbing_within_reach": 0.52},
        },
        "pnpoly_RTX_3090": {
            "one_knob": {"share_climbing_within_reach": 0.7},
            "two_knobs": {"share_climbing_within_reach": 0.95},
        },
    },
}

TUNING_QUALITY: dict[str, Any] = {
    "benchmark": "tuning_quality",
    "quick": True,
    "family": "native",
    "chip": "cpu/AMD EPYC/2c",
    "torch_threads": 2,
    "keys": [
        {
            "kernel": "add",
            "shape": "n=4194304",
            "times": {
                "tuned": _times(0.45),
                "exhaustive": _times(0.44),
                "default": _times(0.5),
                "vendor": _times(0.46),
            },
        },
        {  # the default rule's config was invalid: no default bar
            "kernel": "fused_attention",
            "shape": "batch=1,heads=8,seq_q=1024,seq_kv=1024,head_dim=64,causal=1",
            "times": {"tuned": _times(6.8), "exhaustive": _times(6.8), "vendor": _times(8.7)},
        },
    ],
    "summary": {"median_tuned_over_exhaustive": 1.01, "worst_tuned_over_exhaustive": 1.04},
    "wall_s": 109.0,
}

GPU_CHECK: dict[str, Any] = {
    "benchmark": "gpu_check",
    "device": "cuda/NVIDIA H200/sm_90",
    "torch": "2.13.0+cu128",
    "keys": [
        {
            "kernel": "triton_fused_attention",
            "shape": "batch=4,heads=16,seq_q=1024,seq_kv=1024,head_dim=64,causal=0",
            "dtype": "float16",
            "times_ms": {"tuned": 0.21, "torch": 0.19, "default": 0.4},
            "tuned_over_torch": 1.1,
            "speedup_vs_default": 1.9,
        },
        {  # the tuned config is the default's: measured once
            "kernel": "triton_matmul",
            "shape": "m=4096,n=4096,k=4096",
            "dtype": "float16",
            "times_ms": {"tuned": 0.2, "torch": 0.18},
            "tuned_over_torch": 1.11,
            "speedup_vs_default": 1.0,
        },
    ],
    "families": {
        "implementations": [
            {
                "kernel": "triton_softmax",
                "shape": "rows=8192,cols=4096",
                "dtype": "float16",
                "correct": True,
                "times_ms": {"triton": 0.3, "torch": 0.28},
                "triton_over_torch": 1.07,
            },
            {  # torch has no attention op of its lse on CUDA: timed in the keys part instead
                "kernel": "triton_fused_attention",
                "shape": "batch=2,heads=16,kv_heads=16,seq_q=2048,seq_kv=2048,head_dim=128,causal=1,mask=0",
                "dtype": "bfloat16",
                "correct": True,
                "times_ms": {"triton": 1.2},
            },
            {"kernel": "triton_add", "dtype": "float16", "correct": False, "error": "mismatch"},
        ],
        "tuned": [
            {
                "kernel": "triton_softmax",
                "implementation": "vendor",
                "speedup_vs_default": 1.1,
                "speedup_vs_vendor": 1.0,
            }
        ],
        "goals": {
            "every_triton_kernel_correct": False,
            "every_key_tuned": True,
            "no_tuned_key_slower_than_torch": True,
        },
    },
    "fault": {
        "before_ok": True,
        "fault_error": "RuntimeError: CUDA error: an illegal memory access was encountered",
        "after_ok": True,
        "trial_process_replaced": True,
        "this_process_cuda_ok": True,
        "goal_fault_fails_alone": True,
    },
    "summary": {
        "worst_attention_over_flash_sdpa": 1.1,
        "median_attention_speedup_vs_default": 1.9,
        "worst_matmul_over_torch": 1.11,
        "goals": {"attention_within_1.2x_flash_sdpa": True, "attention_ge_1.3x_default": True},
    },
    "wall_s": 240.0,
}

SERVICE_OVERHEAD: dict[str, Any] = {
    "benchmark": "service_overhead",
    "kernel": "softmax",
    "shape": {"rows": 256, "cols": 1024},
    "trials": 30,
    "batch": 4,
    "overhead_per_trial_ms": {"median": 3.9, "min": -0.5, "max": 8.0},
    "pairs": [{"local_s": 0.62, "service_s": 0.73}, {"local_s": 0.7, "service_s": 0.68}],
}

REPLAY_WORKER_COST: dict[str, Any] = {
    "benchmark": "replay_worker_cost",
    "lookup": {"kernel": "replay_pnpoly_RTX_3090", "us_per_trial_median": 38.5},
    "service": {
        "jobs": 40,
        "trials_per_job": 25,
        "batch": 8,
        "workers": 1,
        "trials_per_s": 130.0,
        "worker_cpu_ms_per_trial": 1.0,
        "server_cpu_ms_per_trial": 5.8,
    },
}


def _wrk(connections: int, rate: float, p50: float, p99: float) -> dict[str, Any]:
    return {"connections": connections, "requests_per_s": rate, "p50_ms": p50, "p99_ms": p99, "errors": 0}


HTTP_LOAD: dict[str, Any] = {
    "benchmark": "http_load",
    "configs": 10_000,
    "database": "sqlite",
    "duration_s": 10.0,
    "scenarios": {
        "trivial": _wrk(64, 3728.0, 16.0, 25.0),
        "lookups": _wrk(64, 1899.0, 31.0, 52.0),
        "exports": _wrk(200, 1942.0, 96.0, 231.0),
        "revalidate": _wrk(1, 2052.0, 0.45, 1.2),
        "mixed": {
            "clients": 64,
            "endpoints": {
                "lookups": _wrk(40, 716.0, 46.0, 168.0),
                "worker_ask": {
                    "clients": 12,
                    "requests_per_s": 22.0,
                    "p50_ms": 120.0,
                    "p99_ms": 900.0,
                    "errors": 0,
                },
            },
        },
    },
    "goals": [
        {"goal": "lookups: p99 ms <= 50 at 64 connections", "value": 52.0, "pass": False},
        {"goal": "revalidate (304): p50 ms <= 5", "value": 0.45, "pass": True},
        {"goal": "mixed worker_ask: p99 ms <= 100", "value": 900.0, "pass": False},
    ],
}

HTTP_LOOKUP: dict[str, Any] = {
    "benchmark": "http_lookup",
    "configs": 10_000,
    "database": "sqlite",
    "cpu_count": 2,
    "levels": [
        {"clients": 1, "requests": 5000, "errors": 0, "requests_per_s": 1000.0, "p50_ms": 0.9, "p99_ms": 2.1},
        {
            "clients": 16,
            "requests": 9000,
            "errors": 0,
            "requests_per_s": 1800.0,
            "p50_ms": 8.5,
            "p99_ms": 20.0,
        },
        {
            "clients": 64,
            "requests": 9500,
            "errors": 0,
            "requests_per_s": 1900.0,
            "p50_ms": 33.0,
            "p99_ms": 60.0,
        },
    ],
}


def _size(import_s: list[float], rate: float, p99: float) -> dict[str, Any]:
    rounds = [{"requests_per_s": rate, "p50_ms": 26.0, "p99_ms": p99, "max_ms": 2 * p99, "errors": 0}]
    return {"import_s": import_s, "rounds": rounds, "lookups": {**rounds[0], "not_ok_by_status": {}}}


STORE_SIZE: dict[str, Any] = {
    "benchmark": "store_size",
    "database": "sqlite",
    "chunk": 10_000,
    "connections": 64,
    "duration_s": 8.0,
    "rounds": 3,
    "sizes": {"10000": _size([3.5], 2300.0, 64.0), "100000": _size([3.5, 3.6, 3.9], 2290.0, 73.0)},
    "goals": [
        {"goal": "100000: p99 / smallest's <= 1.2", "value": 1.14, "pass": True},
        {"goal": "100000: errors == 0", "value": 3, "pass": False},
    ],
}

LOOKUP_LATENCY: dict[str, Any] = {
    "benchmark": "lookup_latency",
    "hit": {
        "client": {"p50_ns": 296.0, "p99_ns": 470.0},
        "bare_dict": {"p50_ns": 83.0, "p99_ns": 124.0},
        "ratio_p50": 3.6,
        "goals": {"p50_le_1us": True, "le_5x_bare": True},
    },
    "prefetch": {"configs": 10_000, "median_s": 0.7, "runs_s": [0.58, 0.7, 0.93]},
    "launches": {
        "launches": 100_000,
        "with_client_ns_per_launch": 1483.0,
        "without_ns_per_launch": 931.0,
        "overhead_ns_per_launch": 552.0,
    },
    "down_server": {
        "first_call_s": 0.053,
        "launches": 10_000,
        "down_total_ms": 3.05,
        "healthy_total_ms": 3.0,
        "added_ms": 0.05,
        "goal_added_le_1ms": True,
    },
}


def _page(path: str, median: float, p95: float) -> dict[str, Any]:
    return {
        "path": path,
        "status": 200,
        "bytes": 13_000,
        "median_ms": median,
        "p95_ms": p95,
        "min_ms": median * 0.9,
        "meets_goal": p95 <= 150,
    }


DASHBOARD: dict[str, Any] = {
    "benchmark": "dashboard",
    "store": {"url": "sqlite", "fill_s": 40.0, "rows": {"best_configs": 10_000, "trials": 200_000}},
    "goal_ms": 150.0,
    "repeats": 20,
    "pages": {
        "overview": _page("/", 42.6, 45.2),
        "job_5000_trials": _page("/jobs/201", 65.2, 82.3),
        "kernel_500_rows": _page("/kernels/matmul?per_page=500", 140.0, 160.0),  # misses the goal
    },
    "all_meet_goal": False,
}


def _step(median: float) -> dict[str, Any]:
    """One variant's step as ``model_step`` reports it."""
    return {"median_ms": median, "p10_ms": median * 0.97, "p90_ms": median * 1.08, "samples": 3}


def _model_sequence(seq: int, scale: float) -> dict[str, Any]:
    """One sequence length of a ``model_step`` document: (d) faster than (c), slower than (a)."""
    inference = {"a": 100.0, "b": 80.0, "c": 150.0, "d": 110.0, "e": 85.0}
    times = {
        name: {"inference": _step(ms * scale), "training": _step(3 * ms * scale)}
        for name, ms in inference.items()
    }
    operator = {"calls": 10, "self_cpu_ms": 50.0, "total_cpu_ms": 60.0}
    profile = {
        "profile_cpu_ms": 100.0 * scale,
        "operators": {
            "matmul": {**operator, "self_share": 0.55, "total_share": 0.6},
            "fused_attention": {**operator, "self_share": 0.2, "total_share": 0.2},
            "rms_norm": {**operator, "self_share": 0.03, "total_share": 0.03},
        },
        "self_share": 0.78,
        "total_share": 0.83,
    }
    lookups = {
        "calls_per_step": 15,
        "distinct_keys": 7,
        "matches": {"exact": 7},
        "get_ns_per_call": 300.0,
        "select_ns_per_call": 4000.0,
        "get_share_of_step": 15 * 300.0 / (110e6 * scale),
        "select_share_of_step": 15 * 4000.0 / (110e6 * scale),
    }
    return {
        "seq": seq,
        "times": times,
        "compile_s": {"b": {"inference": 20.0, "training": 30.0}, "e": {"inference": 12.0, "training": 30.0}},
        "ratios": {
            kind: {
                "c_over_a": times["c"][kind]["median_ms"] / times["a"][kind]["median_ms"],
                "d_over_a": times["d"][kind]["median_ms"] / times["a"][kind]["median_ms"],
                "c_over_d": times["c"][kind]["median_ms"] / times["d"][kind]["median_ms"],
                "e_over_b": times["e"][kind]["median_ms"] / times["b"][kind]["median_ms"],
            }
            for kind in ("inference", "training")
        },
        "profile": {"inference": profile, "training": profile},
        "lookups": {"inference": lookups, "training": lookups},
    }


def _goal(bound: float, sense: str, values: list[float], met: bool) -> dict[str, Any]:
    return {
        "bound": bound,
        "sense": sense,
        "values": dict(zip(("256", "512"), values, strict=True)),
        "met": met,
    }


MODEL_STEP: dict[str, Any] = {
    "benchmark": "model_step",
    "quick": True,
    "model": {"layers": 2, "hidden": 512, "heads": 8, "kv_heads": 2, "mlp": 1408, "vocab": 4096, "batch": 1},
    "machine": {"cpu_count": 2, "torch_threads": 2, "torch": "2.13.0+cpu"},
    "repeats": 3,
    "variants": {
        "a": "torch eager",
        "b": "torch.compile(a)",
        "c": "tiletune ops, default rules",
        "d": "tiletune ops, tuned configs",
        "e": "torch.compile(d)",
    },
    "tuning": {
        "path": "demand",
        "chip": "cpu/Test/2c",
        "trials_per_job": 4,
        "jobs": 14,
        "states": {"done": 14},
    },
    "sequences": [_model_sequence(256, 1.0), _model_sequence(512, 2.5)],
    "goals": {
        "c_over_a": _goal(1.02, "le", [1.5, 1.5], False),
        "d_over_a": _goal(1.0, "le", [1.1, 1.1], False),
        "e_over_b": _goal(1.0, "le", [1.06, 1.06], False),
        "lookups_share": _goal(0.01, "le", [4e-5, 2e-5], True),
    },
}


def _untuned_key(kernel: str, shape: str, ratio: float) -> dict[str, Any]:
    return {
        "kernel": kernel,
        "shape": shape,
        "backend": "native",
        "rule_ms": ratio,
        "vendor_ms": 1.0,
        "rule_over_vendor": ratio,
        "untuned_runs": "rule" if kernel.startswith("rms_norm") else "vendor",
        "invalid": None,
    }


UNTUNED_CHOICE: dict[str, Any] = {
    "benchmark": "untuned_choice",
    "chip": "cpu/Test/2c",
    "torch": "2.13.0+cpu",
    "torch_threads": 2,
    "keys": [
        _untuned_key("rms_norm", "rows=1024,cols=512", 0.4),
        _untuned_key("matmul", "m=1024,n=1408,k=512,a_transposed=0,b_transposed=1", 2.0),
        _untuned_key(
            "fused_attention", "batch=1,heads=8,kv_heads=2,seq_q=1024,seq_kv=1024,head_dim=64,causal=1", 1.5
        ),
    ],
    "rule_faster_at_every_key": ["rms_norm"],
    "overhead": {
        "rounds": 3,
        "calls": 10,
        "operators": {"matmul": {"tiletune_us": 90.0, "torch_us": 4.0, "added_us": 86.0}},
    },
    "cold": {
        "samples": 3,
        "calls": {
            "matmul_operator": {"tiletune_us": 2300.0, "torch_us": 2100.0, "added_us": 200.0},
            "linear_function": {"tiletune_us": 2120.0, "torch_us": 2100.0, "added_us": 20.0},
        },
    },
}


def _tuned_key(kernel: str, shape: str, seconds: float, implementation: str) -> dict[str, Any]:
    """One key of ``local_tune``."""
    phases = {"prepare": 0.1, "trials": seconds * 0.4, "search": 0.01, "validate": seconds * 0.5}
    return {
        "kernel": kernel,
        "shape": shape,
        "dtype": "float32",
        "seconds": seconds,
        "error": None,
        "implementation": implementation,
        "speedup_vs_vendor": 1.0,
        "trials": 16,
        "phases": phases,
    }


LOCAL_TUNE: dict[str, Any] = {
    "benchmark": "local_tune",
    "quick": True,
    "model": {"kind": "llama", "seq": 128, "batch": 1},
    "trials_per_key": 16,
    "keys": [
        _tuned_key("rms_norm", "rows=128,cols=512", 4.0, "native"),
        _tuned_key("matmul", "m=128,n=512,k=512,a_transposed=0,b_transposed=1", 5.0, "vendor"),
    ],
    "total_s": 9.5,
    "second_run": {"seconds": 1.0, "keys": 2, "tuned": 0, "exact": 2},
    "goal": {"bound_s": 120.0, "keys": 2, "met": True},
}


WORKER_AGREEMENT: dict[str, Any] = {
    "benchmark": "worker_agreement",
    "command": "python -m benchmarks.worker_agreement --trials 8",
    "agreement_ratio": 2.0,
    "jobs": [],
    "pairs": [
        {"kernel": "add", "ratio": 1.1},
        {"kernel": "add", "ratio": 1.2},
        {"kernel": "matmul", "ratio": 0.9},
    ],
    "summary": {"pairs": 3, "median": 1.1, "p90": 1.2, "worst": 1.2, "within_agreement_ratio": 1.0},
}


#: Every document, by its ``benchmark`` field.
DOCUMENTS: dict[str, dict[str, Any]] = {
    document["benchmark"]: document
    for document in (
        SEARCH_REPLAY,
        SPACE_BASINS,
        TUNING_QUALITY,
        GPU_CHECK,
        SERVICE_OVERHEAD,
        REPLAY_WORKER_COST,
        HTTP_LOAD,
        HTTP_LOOKUP,
        STORE_SIZE,
        LOOKUP_LATENCY,
        DASHBOARD,
        MODEL_STEP,
        ISOLATION_OVERHEAD,
        CPP_LOOKUP,
        COMPILE_TIME_TILES,
        UNTUNED_CHOICE,
        LOCAL_TUNE,
        WORKER_AGREEMENT,
    )
}
