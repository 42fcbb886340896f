"""A Llama-style model's step time on tiletune's operators against torch's, on this CPU.

The model (``--model decoder``: ``benchmarks/model/decoder.py``, plain ``torch.nn``, RMSNorm,
grouped-query SDPA, SwiGLU; ``--model llama``: Hugging Face's ``LlamaForCausalLM`` from a small
config, rotary embeddings, ``benchmarks/model/llama.py``) runs five ways, each on its own copy of
the same weights:

  (a) torch eager;                        (b) ``torch.compile`` of (a);
  (c) ``tiletune.nn.patch`` of it with no config source (untuned: torch's op where it has one,
      the native rule where that measured faster: ``docs/operators.md``);
  (d) the same on tuned configs;
  (e) ``torch.compile`` of (d).

(d)'s configs, ``--tuning switch`` (the default): the patched model runs one inference and one
training step per sequence length under the one switch's source (``TILETUNE_TUNE=1``,
:mod:`tiletune.tuner.measure.tuning_source`: each key tuned on this machine, ``--trials`` each),
and a ``ConfigClient`` pinned to the file it wrote answers (d) and (e). ``--tuning demand``: a
``tiletune server`` (a fresh SQLite file, demand from a key's first report) and
a ``ConfigClient`` of it; the patched model runs one inference and one training step per
sequence length on the client, the client reports the keys it missed, the server queues one
demand job per key, ``tiletune worker --backend cpu --once`` tunes them (``--trials`` each; each
job's validation run measures torch's op beside the tiles), and the client prefetches every
config of this chip before the timing.

Per sequence length: an inference step (a forward under ``torch.no_grad``) and a training step
(forward, cross-entropy, backward, AdamW) of each variant, timed round-robin in one run
(``--repeats`` rounds, the order shuffled each round, seeded; compilation excluded): median, p10, p90 ms;
the ratios (c)/(a), (d)/(a), (c)/(d), (e)/(b), each the median over the rounds of the round's
ratio (the ratios of the medians beside them); each operator's share of (d)'s step under
``torch.profiler`` (for a training step, per phase: each operator's forward and backward share);
the config lookups' share of (d)'s step (calls per step × ns per call); which implementation
each tuned key chose. The goals (:data:`GOALS`: untuned c ≤ 1.02× a, tuned d ≤ 1.00× a,
e ≤ 1.00× b, on inference and on training steps; on the decoder, training d ≤ 0.95× a at 2,048
tokens; lookups ≤ 1 % of an inference step) are reported as measured, met or not.

Prints one JSON document on stdout (``"benchmark": "model_step"``), progress on stderr. Run from
the repository root: ``.venv/bin/python benchmarks/model_step.py [--quick]``; plot it with
``benchmarks/plot.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python benchmarks/model_step.py`: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch import nn

from benchmarks.model import demand
from benchmarks.model.costs import lookup_cost, operator_shares
from benchmarks.model.decoder import DecoderShape, build_decoder
from benchmarks.model.llama import build_llama
from benchmarks.model.steps import STEPS, Variant, make_variants, measure, on_operators, spread, warm_up
from tiletune.client import ConfigClient
from tiletune.kernels.defaults import client_settings
from tiletune.kernels.launcher import ConfigSource
from tiletune.kernels.ops import configure
from tiletune.tuner.measure.tuning_source import TuningSettings, TuningSource

#: The goals: a ratio (the median over rounds of the two variants' times in a round: :func:`ratios`;
#: or the lookups' share of a step) -> its bound, and whether the
#: value must be at most (``le``) or at least (``ge``) that bound; unprefixed on inference steps,
#: ``training_`` on training steps (forward, backward and optimizer, the backward on tuned kernels).
#: A name ending ``_at_<seq>`` is judged at that sequence length alone, on the models named in
#: :data:`GOAL_MODELS` (every model where a goal is not named there).
GOALS = {
    "c_over_a": (1.02, "le"),
    "d_over_a": (1.00, "le"),
    "e_over_b": (1.00, "le"),
    "lookups_share": (0.01, "le"),
    "training_c_over_a": (1.02, "le"),
    "training_d_over_a": (1.00, "le"),
    "training_e_over_b": (1.00, "le"),
    "training_d_over_a_at_2048": (0.95, "le"),
}
#: The models a goal is set for, where not every model's.
GOAL_MODELS = {"training_d_over_a_at_2048": ("decoder",)}
TRAINING_PREFIX = "training_"
#: The models ``--model`` names, and their default vocabularies (Llama's, where the LM head's
#: matmul is a larger share of the step).
MODELS = ("decoder", "llama")
DECODER_VOCAB = 4096
LLAMA_VOCAB = 32000
#: ``--quick``: a run of a few minutes (one short sequence, two layers, few rounds and trials).
QUICK = {"seqs": [512], "layers": 2, "repeats": 5, "trials": 4}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--seqs", type=int, nargs="+", default=[1024, 2048], help="sequence lengths (default 1024 2048)"
    )
    parser.add_argument(
        "--model",
        choices=MODELS,
        default="decoder",
        help="the plain torch.nn decoder, or Hugging Face's LlamaForCausalLM of its sizes (default decoder)",
    )
    parser.add_argument("--batch", type=int, default=1, help="sequences per step (default 1)")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers (default 4)")
    parser.add_argument("--hidden", type=int, default=512, help="hidden size (default 512)")
    parser.add_argument("--heads", type=int, default=8, help="query heads (default 8)")
    parser.add_argument("--kv-heads", type=int, default=2, help="key/value heads (default 2)")
    parser.add_argument("--mlp", type=int, default=1408, help="SwiGLU width (default 1408)")
    parser.add_argument(
        "--vocab", type=int, default=None, help="vocabulary (default 4096; 32000 for --model llama)"
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds per sequence (default 5)")
    parser.add_argument("--trials", type=int, default=6, help="trials of each key's tuning (default 6)")
    parser.add_argument(
        "--tuning",
        choices=("switch", "demand"),
        default="switch",
        help="how (d)'s keys are tuned: the one switch on this machine, or the service's demand path",
    )
    parser.add_argument(
        "--tune-timeout", type=float, default=600.0, help="seconds the worker may tune for (default 600)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a short run: " + ", ".join(f"--{k} {v}" for k, v in QUICK.items()),
    )
    args = parser.parse_args(argv)
    if args.quick:
        for name, value in QUICK.items():
            setattr(args, name, value)
    if args.vocab is None:
        args.vocab = LLAMA_VOCAB if args.model == "llama" else DECODER_VOCAB
    return args


def progress(message: str) -> None:
    print(f"model_step: {message}", file=sys.stderr, flush=True)


def tokens_of(args: argparse.Namespace, seq: int) -> torch.Tensor:
    """The token ids of a step: the same for every variant."""
    generator = torch.Generator().manual_seed(seq)
    return torch.randint(0, args.vocab, (args.batch, seq), generator=generator)


def run_on_client(base: nn.Module, client: ConfigSource, args: argparse.Namespace) -> None:
    """One inference and one training step per sequence length of a patched copy of ``base`` on
    ``client``: the client meets (a client counts as misses, a tuning source tunes) every key the
    timed variants will ask."""
    variant = on_operators(base, "d", "tiletune ops, on the client", client)
    for seq in args.seqs:
        for kind in STEPS:
            variant.step(kind, tokens_of(args, seq))


def tune_on_demand(
    base: nn.Module, server: demand.TuningServer, args: argparse.Namespace, folder: Path
) -> tuple[ConfigClient, dict[str, Any]]:
    """The demand path (see the module docstring): a client holding the tuned configs, and what
    the tuning did."""
    chip = demand.register_this_chip(server)
    client = demand.tuning_client(server)
    progress(f"running the patched model once on a client of {server.url} ({chip})")
    run_on_client(base, client, args)
    queued = demand.report_misses(client, server)
    progress(f"{len(queued)} demand jobs queued; a CPU worker tunes them ({args.trials} trials each)")
    worker_s = demand.run_worker(server, folder, args.tune_timeout)
    jobs = demand.job_summary(server)
    progress(f"worker done in {worker_s:.0f} s: {jobs['states']}")
    started = time.perf_counter()
    configs = client.prefetch()
    return client, {
        "path": "demand",
        "chip": chip,
        "trials_per_job": args.trials,
        "worker_s": worker_s,
        "prefetched_configs": configs,
        "prefetch_s": time.perf_counter() - started,
        **jobs,
    }


#: The ratios reported, each (numerator, denominator) variant.
RATIOS = {"c_over_a": ("c", "a"), "d_over_a": ("d", "a"), "c_over_d": ("c", "d"), "e_over_b": ("e", "b")}


def tune_with_switch(
    base: nn.Module, args: argparse.Namespace, folder: Path
) -> tuple[ConfigClient, dict[str, Any]]:
    """The one switch's path (``TILETUNE_TUNE=1``): the patched model's steps under a tuning source
    (``--trials`` per key), then a client pinned to the file it wrote, and what the tuning did."""
    path = folder / "tiletune_configs.json"
    source = TuningSource(TuningSettings(path=path, trials=args.trials))
    progress(f"tuning each key the steps meet on this machine ({args.trials} trials each)")
    started = time.perf_counter()
    try:
        run_on_client(base, source, args)
    finally:
        source.close()
    tuning_s = time.perf_counter() - started
    client = ConfigClient(None, source.client.chip, settings=client_settings(cache_dir=None))
    configs = client.import_bundle(path)
    client.pin()
    reports = [done.report for done in source.tuned if done.report is not None]
    progress(f"{len(reports)} of {len(source.tuned)} keys tuned in {tuning_s:.0f} s")
    return client, {
        "path": "switch",
        "chip": source.client.chip,
        "trials_per_job": args.trials,
        "tuning_s": tuning_s,
        "prefetched_configs": configs,
        "jobs": len(source.tuned),
        "failed": [done.line() for done in source.tuned if done.report is None],
        "kernels": dict(Counter(done.kernel for done in source.tuned)),
        "chose_vendor": sum(report.implementation == "vendor" for report in reports),
        "per_job": [
            {
                "kernel": report.kernel,
                "shape": report.shape,
                "implementation": report.implementation,
                "completed": report.counts.get("completed", 0),
                "speedup_vs_default": report.speedup_vs_default,
                "speedup_vs_vendor": report.speedup_vs_vendor,
            }
            for report in reports
        ],
    }


def ratios(samples: dict[str, dict[str, list[float]]], kind: str) -> dict[str, float]:
    """The ratios the goals speak of, for ``kind`` steps: per ratio, the median over the rounds of
    the two variants' times in that round (each round times every variant once, so a drift of the
    machine between rounds cancels in the round's ratio)."""
    return {
        name: statistics.median(
            top / bottom for top, bottom in zip(samples[over][kind], samples[under][kind], strict=True)
        )
        for name, (over, under) in RATIOS.items()
    }


def ratios_of_medians(times: dict[str, dict[str, dict[str, Any]]], kind: str) -> dict[str, float]:
    """The same ratios as ratios of the variants' medians (reported beside, not judged)."""
    median = {name: steps[kind]["median_ms"] for name, steps in times.items()}
    return {name: median[over] / median[under] for name, (over, under) in RATIOS.items()}


def measure_sequence(
    base: nn.Module, client: ConfigClient | None, args: argparse.Namespace, seq: int
) -> dict[str, Any]:
    """Every variant's steps at ``seq`` tokens, timed round-robin; (d)'s profile and lookups."""
    tokens = tokens_of(args, seq)
    variants = make_variants(base, client)
    progress(f"seq {seq}: warming up (compiling b and e)")
    warm_up(variants, tokens)
    samples = measure(variants, tokens, args.repeats)
    times = {v.name: {kind: spread(samples[v.name][kind]) for kind in STEPS} for v in variants}
    on_tuned = next(v for v in variants if v.name == "d")
    progress(f"seq {seq}: profiling d, counting its lookups")
    return {
        "seq": seq,
        "times": times,
        "compile_s": {v.name: v.compile_s for v in variants if v.name in ("b", "e")},
        "ratios": {kind: ratios(samples, kind) for kind in STEPS},
        "ratios_of_medians": {kind: ratios_of_medians(times, kind) for kind in STEPS},
        "profile": {kind: operator_shares(on_tuned, kind, tokens) for kind in STEPS},
        "lookups": lookups(on_tuned, times["d"], tokens),
    }


def lookups(variant: Variant, times: dict[str, dict[str, Any]], tokens: torch.Tensor) -> dict[str, Any]:
    """(d)'s lookups per step and their share of its median step, per step kind (without a source:
    the rules, nothing is looked up)."""
    if variant.source is None:
        return dict.fromkeys(STEPS)
    return {kind: lookup_cost(variant, kind, tokens, times[kind]["median_ms"]) for kind in STEPS}


def goals(sequences: list[dict[str, Any]], model: str = "decoder") -> dict[str, Any]:
    """Each goal set for ``model``, per sequence length and over all: on inference medians, or
    training medians for the ``training_`` goals; an ``_at_<seq>`` goal at that length alone."""
    found: dict[str, Any] = {}
    for name, (bound, sense) in GOALS.items():
        if model not in GOAL_MODELS.get(name, (model,)):
            continue
        ratio, _, at = name.partition("_at_")
        values = {}
        for sequence in sequences:
            if at and str(sequence["seq"]) != at:
                continue
            if ratio == "lookups_share":
                cost = sequence["lookups"]["inference"]
                value = cost["get_share_of_step"] if cost is not None else None
            elif ratio.startswith(TRAINING_PREFIX):
                value = sequence["ratios"]["training"][ratio.removeprefix(TRAINING_PREFIX)]
            else:
                value = sequence["ratios"]["inference"][ratio]
            values[str(sequence["seq"])] = value
        if not values:
            continue
        met = [v is not None and (v <= bound if sense == "le" else v >= bound) for v in values.values()]
        found[name] = {"bound": bound, "sense": sense, "values": values, "met": all(met)}
    return found


def document(
    args: argparse.Namespace, shape: DecoderShape, tuning: dict[str, Any], sequences: list[dict[str, Any]]
) -> dict[str, Any]:
    """The benchmark's JSON document."""
    return {
        "benchmark": "model_step",
        "quick": args.quick,
        "model": {
            "kind": args.model,
            **vars(shape),
            "batch": args.batch,
            "parameters": sum(p.numel() for p in build_model(args.model, shape).parameters()),
        },
        "machine": {
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
        },
        "repeats": args.repeats,
        "variants": {
            "a": "torch eager",
            "b": "torch.compile(a)",
            "c": "tiletune ops, untuned",
            "d": "tiletune ops, tuned configs",
            "e": "torch.compile(d)",
        },
        "tuning": tuning,
        "sequences": sequences,
        "goals": goals(sequences, args.model),
    }


def build_model(kind: str, shape: DecoderShape) -> nn.Module:
    """The model ``--model`` names, of ``shape``'s sizes (the same seed: the same weights)."""
    return build_llama(shape) if kind == "llama" else build_decoder(shape)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.pop("TILETUNE_URL", None)
    configure()  # the process's source: the kernels' rules; (d) and (e) run under the client
    shape = DecoderShape(args.layers, args.hidden, args.heads, args.kv_heads, args.mlp, args.vocab)
    base = build_model(args.model, shape)
    with tempfile.TemporaryDirectory() as folder:
        if args.tuning == "switch":
            client, tuning = tune_with_switch(base, args, Path(folder))
        else:
            with demand.tuning_server(Path(folder), args.trials) as server:
                client, tuning = tune_on_demand(base, server, args, Path(folder))
        try:
            sequences = [measure_sequence(base, client, args, seq) for seq in args.seqs]
        finally:
            client.close()
    json.dump(document(args, shape, tuning, sequences), sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
