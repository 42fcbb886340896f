"""local_tune: what the one switch costs on a model, and where the time goes.

Every key an inference step and a training step of a model meet, tuned on this machine with no
server (``tiletune.tune(model, tokens)``, the path ``TILETUNE_TUNE=1`` takes; ``--trials`` per
key, isolated trials, the judge with torch's op), timed as a whole, each key split into its
phases (``prepare``: the bench built in the trial process and the default checked, the first
key's including the process's start; ``trials``; ``search``: the strategy's asks and tells;
``validate``: the interleaved validation run). Then a second run over the file (a fresh source,
as a second ``TILETUNE_TUNE=1`` run makes): every key it meets must be an exact answer, none
tuned.

The goal (issue "Tune a model with one switch"): 19 keys of a small Hugging Face model at 1,024
tokens, 16 trials each, in at most 120 s on 2 cores.

    .venv/bin/python benchmarks/local_tune.py [--model llama|decoder] [--seq 1024] [--trials 16]
        [--quick] [--finalists 3] [--worker-measurement] [--out docs/figures/local_tune.json]

``--worker-measurement`` measures as a worker does (each search trial timed again beside the
default), on local tuning's timing budget: what the switch's own measurement saves.

Prints the JSON document (``"benchmark": "local_tune"``) and writes it to ``--out`` when given.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import tiletune
from benchmarks.model.decoder import DecoderShape, build_decoder
from benchmarks.model.llama import build_llama
from tiletune.tuner.measure.bench import BenchSettings
from tiletune.tuner.measure.model_tuning import tune_steps
from tiletune.tuner.measure.tuning_source import (
    LOCAL_BUDGET_S,
    LOCAL_FINALISTS,
    KeyTuned,
    TuningSettings,
)

#: The goal's bound on the whole tuning, seconds.
GOAL_S = 120.0
PHASES = ("prepare", "trials", "search", "validate")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", choices=("llama", "decoder"), default="llama", help="the model to tune")
    parser.add_argument("--seq", type=int, default=1024, help="tokens of the batch-1 input")
    parser.add_argument("--trials", type=int, default=16, help="trials per key")
    parser.add_argument("--quick", action="store_true", help="128 tokens, 4 trials: a smoke run")
    parser.add_argument(
        "--finalists", type=int, default=LOCAL_FINALISTS, help="top configs in each validation run"
    )
    parser.add_argument(
        "--worker-measurement",
        action="store_true",
        help="measure as a worker does: each search trial timed again beside the default",
    )
    parser.add_argument("--out", type=Path, help="also write the JSON document here")
    args = parser.parse_args(argv)
    if args.quick:
        args.seq, args.trials = 128, 4
    return args


def key_record(done: KeyTuned) -> dict[str, Any]:
    """One key's line of the document."""
    report = done.report
    return {
        "kernel": done.kernel,
        "shape": done.shape,
        "dtype": done.dtype,
        "seconds": done.seconds,
        "error": done.error,
        "implementation": report.implementation if report else None,
        "speedup_vs_vendor": report.speedup_vs_vendor if report else None,
        "trials": report.counts.get("completed", 0) if report else 0,
        "phases": {phase: report.phases.get(phase, 0.0) for phase in PHASES} if report else {},
    }


def tuning_settings(args: argparse.Namespace, path: Path) -> TuningSettings:
    """The switch's settings (``--trials``), with a worker's measurement on ``--worker-measurement``."""
    if not args.worker_measurement:
        return TuningSettings(path=path, trials=args.trials, finalists=args.finalists)
    worker = dataclasses.replace(BenchSettings(), budget_s=LOCAL_BUDGET_S, against_default=True)
    return TuningSettings(path=path, trials=args.trials, bench=worker, finalists=args.finalists)


def second_run(model: torch.nn.Module, tokens: torch.Tensor, settings: TuningSettings) -> dict[str, Any]:
    """The steps again under a fresh source over the same file: keys met, tuned, answered exactly."""
    started = time.monotonic()
    source = tune_steps(model, (tokens,), settings)
    matches = [source.client.get(kernel, dict(shape), dtype).match for kernel, dtype, shape in source.met]
    return {
        "seconds": time.monotonic() - started,
        "keys": len(source.met),
        "tuned": len(source.tuned),
        "exact": matches.count("exact"),
    }


def summary(keys: list[dict[str, Any]], total_s: float) -> dict[str, Any]:
    """Totals: the keys' seconds, per phase, the steps' own time, the first key's start."""
    tuning_s = sum(k["seconds"] for k in keys)
    phases = {phase: sum(k["phases"].get(phase, 0.0) for k in keys) for phase in PHASES}
    later = [k["phases"]["prepare"] for k in keys[1:] if k["phases"]]
    return {
        "total_s": total_s,
        "tuning_s": tuning_s,
        "steps_s": total_s - tuning_s,
        "phases_s": phases,
        "other_s": tuning_s - sum(phases.values()),
        "first_prepare_s": keys[0]["phases"].get("prepare") if keys and keys[0]["phases"] else None,
        "median_prepare_s": statistics.median(later) if later else None,
        "median_key_s": statistics.median(k["seconds"] for k in keys) if keys else None,
    }


def main(argv: list[str] | None = None) -> None:
    """Tune the model's keys, run it again over the file, print the document."""
    args = parse_args(argv)
    shape = DecoderShape()
    base = build_llama(shape) if args.model == "llama" else build_decoder(shape)
    model = tiletune.patch(base)
    tokens = torch.randint(0, shape.vocab, (1, args.seq), generator=torch.Generator().manual_seed(0))
    with tempfile.TemporaryDirectory() as folder:
        settings = tuning_settings(args, Path(folder) / "tiletune_configs.json")
        started = time.monotonic()
        tuned = tune_steps(model, (tokens,), settings).tuned
        total_s = time.monotonic() - started
        keys = [key_record(done) for done in tuned]
        again = second_run(model, tokens, settings)
    totals = summary(keys, total_s)
    document = {
        "benchmark": "local_tune",
        "quick": args.quick,
        "model": {"kind": args.model, "seq": args.seq, "batch": 1, **dataclasses.asdict(shape)},
        "machine": {
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
        },
        "trials_per_key": args.trials,
        "measurement": "worker" if args.worker_measurement else "local",
        "against_default": settings.bench.against_default,
        "finalists": settings.finalists,
        "keys": keys,
        **totals,
        "second_run": again,
        "goal": {"bound_s": GOAL_S, "keys": len(keys), "met": total_s <= GOAL_S},
    }
    text = json.dumps(document, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(f"local_tune: {len(keys)} keys in {total_s:.0f} s (goal {GOAL_S:.0f} s)", file=sys.stderr)


if __name__ == "__main__":
    main()
