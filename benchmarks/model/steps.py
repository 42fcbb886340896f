"""The variants of one decoder and their steps, timed round-robin in one run.

A :class:`Variant` is one way to run the decoder: its own copy of the weights (the same at the
start for every variant), its own AdamW, optionally compiled, optionally on tiletune's operators
under a config source. Its two steps:

- inference: a forward of the tokens under ``torch.no_grad()``;
- training: forward, next-token cross-entropy, backward, ``AdamW.step()``, ``zero_grad``.

:func:`measure` warms every variant up (compiling the compiled ones, excluded from the times),
then runs ``repeats`` rounds; each round times every variant's step once, in an order shuffled
afresh each round (seeded, as :func:`~tiletune.tuner.measure.bench.measure_interleaved` does), so
drift on a shared machine is spread over all variants alike and what ran just before a variant is
any of the others alike (in a fixed rotation each variant always follows the same one).
"""

from __future__ import annotations

import copy
import random
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.profiler import record_function

import tiletune.nn
from benchmarks.model.decoder import next_token_loss
from tiletune.kernels.launcher import ConfigSource
from tiletune.kernels.ops import using_source
from tiletune.tuner.measure.bench import ORDER_SEED

#: The step kinds, in the document's order.
STEPS = ("inference", "training")
#: The profiler ranges of a training step's phases are named this prefix and the phase.
PHASE_PREFIX = "model_step::"


@dataclass
class Variant:
    """One way to run the decoder (see the module docstring)."""

    name: str
    label: str
    model: nn.Module
    runner: Callable[[Tensor], Tensor]
    source: ConfigSource | None = None
    optimizer: torch.optim.Optimizer = field(init=False)
    #: Seconds of each step kind's first run: a compiled variant's compilation (or its load from
    #: torch's compile cache, when an earlier run left one), not counted in the timings.
    compile_s: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)

    def scope(self) -> AbstractContextManager[None]:
        """Where the step runs: under the variant's config source, if it has one."""
        return using_source(self.source) if self.source is not None else nullcontext()

    def inference(self, tokens: Tensor) -> None:
        """One forward under ``no_grad``."""
        with self.scope(), torch.no_grad():
            self.runner(tokens)

    def training(self, tokens: Tensor) -> None:
        """One training step: forward, loss, backward, AdamW; each phase a profiler range
        (:data:`PHASE_PREFIX` + ``forward``, ``backward``, ``optimizer``), free when not profiling."""
        with self.scope():
            with record_function(PHASE_PREFIX + "forward"):
                loss = next_token_loss(self.runner(tokens), tokens)
            with record_function(PHASE_PREFIX + "backward"):
                torch.autograd.backward(loss)
            with record_function(PHASE_PREFIX + "optimizer"):
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)

    def step(self, kind: str, tokens: Tensor) -> None:
        """The ``kind`` step (``inference`` or ``training``)."""
        (self.inference if kind == "inference" else self.training)(tokens)


def compiled(model: nn.Module) -> Callable[[Tensor], Tensor]:
    """``torch.compile`` of ``model``: one graph (``fullgraph``), static shapes (each sequence
    length its own graph, as a model serving fixed lengths compiles them)."""
    runner: Callable[[Tensor], Tensor] = torch.compile(model, fullgraph=True, dynamic=False)
    return runner


def on_operators(
    base: nn.Module, name: str, label: str, source: ConfigSource | None, *, compile_it: bool = False
) -> Variant:
    """A variant on tiletune's operators: a patched copy of ``base``, under ``source`` (``None``:
    the process's source), compiled or not."""
    model = tiletune.nn.patch(copy.deepcopy(base))
    return Variant(name, label, model, compiled(model) if compile_it else model, source)


def make_variants(base: nn.Module, tuned: ConfigSource | None) -> list[Variant]:
    """The five variants of ``base`` (each a copy of its weights); ``tuned`` is (d)'s and (e)'s
    source (``None``: they run the process's source too)."""
    eager, eager_for_compile = copy.deepcopy(base), copy.deepcopy(base)
    return [
        Variant("a", "torch eager", eager, eager),
        Variant("b", "torch.compile", eager_for_compile, compiled(eager_for_compile)),
        on_operators(base, "c", "tiletune ops, untuned", None),
        on_operators(base, "d", "tiletune ops, tuned configs", tuned),
        on_operators(base, "e", "torch.compile, tiletune ops, tuned", tuned, compile_it=True),
    ]


def warm_up(variants: list[Variant], tokens: Tensor) -> None:
    """Each variant's steps twice (the first compiles a compiled one: its seconds go to ``compile_s``)."""
    for variant in variants:
        for kind in STEPS:
            started = time.perf_counter()
            variant.step(kind, tokens)
            variant.compile_s[kind] = time.perf_counter() - started
            variant.step(kind, tokens)
            print(
                f"model_step:   warm {variant.name} {kind} ({variant.compile_s[kind]:.1f} s first)",
                file=sys.stderr,
            )


def _timed(variant: Variant, kind: str, tokens: Tensor) -> float:
    started = time.perf_counter()
    variant.step(kind, tokens)
    return (time.perf_counter() - started) * 1e3


def measure(variants: list[Variant], tokens: Tensor, repeats: int) -> dict[str, dict[str, list[float]]]:
    """ms per step, per variant and step kind, over ``repeats`` shuffled rounds (see the module)."""
    samples: dict[str, dict[str, list[float]]] = {v.name: {kind: [] for kind in STEPS} for v in variants}
    order = list(variants)
    shuffler = random.Random(ORDER_SEED)
    for round_index in range(repeats):
        shuffler.shuffle(order)
        for kind in STEPS:
            for variant in order:
                samples[variant.name][kind].append(_timed(variant, kind, tokens))
        medians = {v.name: round(statistics.median(samples[v.name]["inference"])) for v in variants}
        print(
            f"model_step:   round {round_index + 1}/{repeats}: inference medians ms {medians}",
            file=sys.stderr,
        )
    return samples


def spread(samples: list[float]) -> dict[str, Any]:
    """Median, p10 and p90 (nearest rank) of ``samples`` ms, and how many."""
    ordered = sorted(samples)

    def rank(fraction: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))]

    return {
        "median_ms": statistics.median(ordered),
        "p10_ms": rank(0.1),
        "p90_ms": rank(0.9),
        "samples": len(ordered),
    }
