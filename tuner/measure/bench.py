"""Honest measurement of kernel configs.

The rules (DESIGN.md, "Measurement"):

- inputs are built once per kernel bench; each config's output is checked
  against the reference *before* any timing. A wrong or crashing config is an
  invalid trial with its reason, never an exception that stops a search;
- warm-up, then repeated timed runs until a time budget is spent or the median
  is known to a target relative confidence; we keep median, p10/p90 and the
  sample count; a sample spans back-to-back launches (``min_sample_ms``);
- timers come from the device (``perf_counter_ns`` on CPU, events on GPUs/NPUs);
- close candidates are compared by re-measuring them interleaved (A B A B ...)
  in one run, never by comparing numbers taken minutes apart; the kernel's
  default config is measured in the same run.
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from tiletune.kernels.conditions import (
    conditions_reader,
    default_flush_bytes,
    measured_at_clock,
)
from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.device import Device
from tiletune.kernels.native.spec import preferred_backend
from tiletune.kernels.spec import KernelSpec
from tiletune.kernels.vendor import run_config
from tiletune.tuner.measure.check import output_mismatch
from tiletune.tuner.measure.measurement import (
    Measurement,
    TrialResult,
    interleaved_measurements,
    median_rel_ci,
)
from tiletune.tuner.measure.referenced import DefaultReference


@dataclass(frozen=True)
class BenchSettings:
    """How long and how precisely to measure one config.

    A measurement stops at the first of: ``max_samples`` samples; ``budget_s``
    of timed runs (after at least ``min_samples``); a 95 % confidence interval
    of the median narrower than ``target_rel_ci`` of it (after ``min_samples``);
    or, when a best time is known, evidence that the config cannot win: its
    fastest sample, or the median of ``min_samples``, over ``prune_ratio`` times
    that best (it is marked ``pruned``).

    ``settle_s``: measurement isolation. Before a measurement, and before every sample of
    an interleaved run, the harness sleeps this long so the thread pool a previous callable
    woke (torch's OpenMP team spins after a parallel op) has gone back to sleep; every
    candidate then starts from the same idle machine, whatever ran before it.

    ``flush_bytes``: bytes written before each timed run to evict the caches; ``None`` (the
    default) is the device's default (:func:`~tiletune.kernels.conditions.default_flush_bytes`:
    256 MiB on CUDA and NPU, 0 on CPUs).

    ``min_sample_ms``: as Triton's ``do_bench``, a sample times enough back-to-back calls (at most
    ``max_launches``, chosen per callable by :func:`warm_up`) to last about this long (as estimated
    from the fastest warm-up run); it records the time per call. One call per sample without
    warm-up runs, when caches are flushed (before every timed call, as on accelerators), or with
    ``0``.

    ``against_default``: a search trial that was not pruned is timed again interleaved with the
    kernel's default, and reported in the default's units (:mod:`tiletune.tuner.measure.referenced`):
    the drift of a shared machine between trials cancels.
    """

    warmup_runs: int = 2
    min_samples: int = 5
    max_samples: int = 500
    budget_s: float = 0.4
    target_rel_ci: float = 0.01
    prune_ratio: float | None = 2.0
    flush_bytes: int | None = None
    settle_s: float = 0.001
    min_sample_ms: float = 1.0
    max_launches: int = 10_000
    against_default: bool = True

    def for_validation(self) -> BenchSettings:
        """The settings of a validation run (:meth:`KernelBench.compare`): three times the budget
        and room for 200 rounds, so the medians the judge compares are known to about a percent
        on a noisy machine (its margin grows with their error: ``finalists.clearly_faster``)."""
        return dataclasses.replace(self, budget_s=3 * self.budget_s, max_samples=max(self.max_samples, 200))


#: Allocations of the inputs, each holding the same values, that a validation run's rounds take in
#: turn (:meth:`KernelBench.compare`): a gain that one placement of the buffers gives and another
#: does not then shows as spread, which widens the judge's margin, instead of as a gain. On the
#: 2-core VM the ratio of the same two configs ranged 1.027-1.058 over six allocations of their
#: inputs (rms_norm 256x512; softmax 256x512: 1.000-1.008).
VALIDATION_INPUT_SETS = 3


def settle(settings: BenchSettings) -> None:
    """Let the previous callable's threads go idle (see :attr:`BenchSettings.settle_s`)."""
    if settings.settle_s > 0:
        time.sleep(settings.settle_s)


class CacheFlusher:
    """Evicts the caches between timed runs by writing a buffer larger than them (optional)."""

    def __init__(self, device: Device, flush_bytes: int | None) -> None:
        flush_bytes = default_flush_bytes(device.kind) if flush_bytes is None else flush_bytes
        self._buffer = (
            torch.empty(flush_bytes // 4, dtype=torch.float32, device=device.torch_device)
            if flush_bytes > 0
            else None
        )
        self.active = self._buffer is not None  # calls flush: a sample is then one launch

    def __call__(self) -> None:
        """Overwrite the flush buffer (a no-op when flushing is off)."""
        if self._buffer is not None:
            self._buffer.fill_(1.0)


def time_launches_ms(fn: Callable[[], object], device: Device, launches: int) -> float:
    """Time ``launches`` back-to-back calls of ``fn`` on ``device``; the time per call, in ms."""
    if launches <= 1:
        return device.time_ms(fn)

    def repeated() -> None:
        for _ in range(launches):
            fn()

    return device.time_ms(repeated) / launches


#: Launches at least this long (ms) are timed in interleaved runs without an untimed call first.
WAKE_CALL_MAX_MS = 10.0
#: Warm-up runs past ``BenchSettings.warmup_runs`` while the launch count is still growing.
EXTRA_WARMUP_RUNS = 4


def warm_up(
    fn: Callable[[], object], device: Device, settings: BenchSettings, flushing: bool, stop_ms: float
) -> tuple[int, list[float]]:
    """Timed warm-up runs: (launches per sample, each run's ms per call), stopping after one over
    ``stop_ms`` that lasted as long as a sample (see below). Each run repeats the count the fastest
    before it suggests (``min_sample_ms``). Past ``warmup_runs``, runs go on (at most
    ``EXTRA_WARMUP_RUNS`` more) until one lasted at least half of ``min_sample_ms``: a slow first
    call (threads starting, pages faulting) must not leave a microsecond kernel timed one or two
    launches at a time. For the same reason a run shorter than that never stops the warm-up over
    ``stop_ms``: the first call of a 20 µs softmax took 60 µs and more, so a prune on it cut the
    space's best configs out of a search (their time a third of the one recorded)."""
    launches, times_ms = 1, list[float]()
    limit = settings.warmup_runs + EXTRA_WARMUP_RUNS if settings.warmup_runs > 0 else 0
    while len(times_ms) < limit:
        timed = launches
        times_ms.append(time_launches_ms(fn, device, timed))
        long_enough = flushing or 2 * timed * times_ms[-1] >= settings.min_sample_ms
        if times_ms[-1] > stop_ms and long_enough:
            break
        if not flushing and settings.min_sample_ms > 0:  # outliers only ever add time: the min
            wanted = math.ceil(settings.min_sample_ms / max(min(times_ms), 1e-9))
            launches = max(1, min(settings.max_launches, wanted))
        if len(times_ms) >= settings.warmup_runs and long_enough:
            break
    return launches, times_ms


def measure(
    fn: Callable[[], object],
    device: Device,
    settings: BenchSettings = BenchSettings(),
    best_known_ms: float | None = None,
) -> Measurement:
    """Time ``fn`` repeatedly on ``device`` under ``settings`` (see :class:`BenchSettings`).

    With ``best_known_ms``, a config that cannot win stops early (``pruned``):
    as soon as its fastest sample is over ``prune_ratio`` times the best, or a
    warm-up run as long as a sample over twice that (warm-up runs may carry first-call
    costs; :func:`warm_up`).
    """
    prune_ms = best_known_ms * settings.prune_ratio if best_known_ms and settings.prune_ratio else math.inf
    flush = CacheFlusher(device, settings.flush_bytes)
    settle(settings)
    launches, warmup_ms = warm_up(fn, device, settings, flush.active, 2 * prune_ms)
    if warmup_ms and warmup_ms[-1] > 2 * prune_ms:
        return Measurement.from_samples(warmup_ms[-1:], pruned=True)
    device.synchronize()
    samples: list[float] = []
    spent_ms = 0.0
    while len(samples) < settings.max_samples:
        flush()
        sample = time_launches_ms(fn, device, launches)
        samples.append(sample)
        spent_ms += sample * launches
        if min(samples) > prune_ms:
            return Measurement.from_samples(samples, pruned=True, launches=launches)
        if len(samples) < settings.min_samples:
            continue
        if statistics.median(samples) > prune_ms:
            return Measurement.from_samples(samples, pruned=True, launches=launches)
        if spent_ms >= settings.budget_s * 1e3 or median_rel_ci(samples) <= settings.target_rel_ci:
            break
    return Measurement.from_samples(samples, launches=launches)


#: The seed of an interleaved run's shuffled orders (:func:`measure_interleaved`).
ORDER_SEED = 0
#: In an interleaved run, a slower callable's sample lasts at most this many ``min_sample_ms``.
SAMPLE_CAP = 10


def common_launches(warm: Sequence[tuple[int, list[float]]], settings: BenchSettings) -> list[int]:
    """The launches per sample of each callable of one interleaved run, from their warm-ups
    (:func:`warm_up`'s counts and times): the largest count (the fastest callable's), for a
    slower callable capped where its sample would last ``SAMPLE_CAP`` times ``min_sample_ms``."""
    common = max((count for count, _ in warm), default=1)
    launches = []
    for _, times in warm:
        fastest = min(times, default=0.0)
        cap = math.ceil(SAMPLE_CAP * settings.min_sample_ms / fastest) if fastest > 0 else common
        launches.append(max(1, min(common, cap)))
    return launches


def measure_interleaved(
    fns: Sequence[Callable[[], object]],
    device: Device,
    settings: BenchSettings = BenchSettings(),
    before_round: Callable[[int], None] | None = None,
) -> list[Measurement]:
    """Measure several callables in rounds (A B C, C A B, B C A, A C B, ...) so drift hits them alike.

    Each round takes one sample of every callable, in an order shuffled afresh each round (seeded:
    the same run gives the same orders), so what ran just before a callable is any of the others
    alike. A fixed rotation had each callable always follow the same one, and what ran before still
    showed through: a fused_attention config measured 4-6 % slower following the default than
    following the exhaustive best on the 2-core VM, enough to decide a comparison. Rounds continue
    until each has ``min_samples`` and the total budget (``budget_s`` per
    callable) is spent, or ``max_samples`` rounds. Every sample is preceded by a
    settle step (:func:`settle`), so the previous callable's threads have gone idle, then
    by one untimed call, so the sample does not time the wake-up of the callable's own threads
    (not when flushing, which must leave the caches cold, nor for launches of ``WAKE_CALL_MAX_MS``
    or more, whose wake-up is lost in their time). Every callable is timed over the same launches
    per sample (:func:`common_launches`): on 2 cores the same config measured 10-15 % slower in
    one-launch samples than in two-launch ones, so counts that differ would decide a comparison.
    ``before_round(i)``, when given, is called before round ``i`` (0 first, after the warm-ups):
    :meth:`KernelBench.compare` switches its inputs there (:class:`InputRotation`).
    """
    flush = CacheFlusher(device, settings.flush_bytes)
    warm = [warm_up(fn, device, settings, flush.active, math.inf) for fn in fns]
    launches = common_launches(warm, settings)
    # after the settle, one untimed call first, unless caches are flushed or a launch is long (or unknown)
    wake = [not flush.active and bool(times) and min(times) < WAKE_CALL_MAX_MS for _, times in warm]
    device.synchronize()
    samples: list[list[float]] = [[] for _ in fns]
    budget_ms = settings.budget_s * 1e3 * len(fns)
    spent_ms = 0.0
    order = list(range(len(fns)))
    shuffler = random.Random(ORDER_SEED)
    for round_index in range(settings.max_samples):
        if before_round is not None:
            before_round(round_index)
        shuffler.shuffle(order)
        for index in order:
            flush()
            if len(fns) > 1:
                settle(settings)
                if wake[index]:
                    fns[index]()
            sample = time_launches_ms(fns[index], device, launches[index])
            samples[index].append(sample)
            spent_ms += sample * launches[index]
        if round_index + 1 >= settings.min_samples and spent_ms >= budget_ms:
            break
    return interleaved_measurements(samples, launches)


class InputRotation:
    """Allocations of the same inputs that the rounds of an interleaved run take in turn.

    ``current`` is the allocation of the round under way; :meth:`select` (a ``before_round`` of
    :func:`measure_interleaved`) moves it. The first allocation is the bench's own, on which every
    config was checked; the others hold the same values, so a config's output is the same on each.
    """

    def __init__(self, allocations: Sequence[tuple[torch.Tensor, ...]]) -> None:
        if not allocations:
            raise ValueError("an input rotation needs at least one allocation")
        self.allocations = list(allocations)
        self.current = self.allocations[0]

    def select(self, round_index: int) -> None:
        """Take the allocation of round ``round_index`` (round-robin)."""
        self.current = self.allocations[round_index % len(self.allocations)]


@dataclass
class KernelBench:
    """Measures configs of one kernel for one shape and dtype on one device.

    Inputs and the reference output are built once, on construction. Every
    ``evaluate`` checks the config's constraint, then its output, then times it. The vendor config
    (torch's op, where the kernel has one) is a config like the others (:func:`run_config`).
    ``backend`` is the implementation ``spec.run`` uses (default: :func:`preferred_backend`,
    i.e. ``native`` on CPUs where the kernel has it, else the spec's first).
    """

    spec: KernelSpec
    shape: Shape
    dtype: str
    device: Device
    backend: str | None = None
    settings: BenchSettings = field(default_factory=BenchSettings)
    seed: int = 0

    def __post_init__(self) -> None:
        self.implementation = self.backend or preferred_backend(self.spec, self.device.kind)
        self.inputs = self.spec.make_inputs(self.shape, self.dtype, self.device.torch_device, self.seed)
        self.expected = self.spec.reference(self.inputs, self.shape)
        self.tolerance = self.spec.tolerance(self.dtype)
        self.read_conditions = conditions_reader(self.device)
        limits = self.device.chip.limits
        default = self.spec.default_config(self.shape, self.dtype, limits)
        valid = self.spec.invalid_reason(default, self.shape, self.dtype, limits) is None
        self.reference = DefaultReference(default if valid else None, self._timed_with)

    def runner(self, config: Config) -> Callable[[], object]:
        """A no-argument callable that runs ``config`` on the prepared inputs."""
        return lambda: run_config(self.spec, self.inputs, config, self.shape, self.implementation)

    def rotated_runner(self, config: Config, rotation: InputRotation) -> Callable[[], object]:
        """A no-argument callable that runs ``config`` on ``rotation``'s current allocation."""
        return lambda: run_config(self.spec, rotation.current, config, self.shape, self.implementation)

    def input_rotation(self, allocations: int) -> InputRotation:
        """The bench's inputs and ``allocations - 1`` more allocations of the same values."""
        more = [
            self.spec.make_inputs(self.shape, self.dtype, self.device.torch_device, self.seed)
            for _ in range(allocations - 1)
        ]
        return InputRotation([self.inputs, *more])

    def check(self, config: Config) -> TrialResult | None:
        """An invalid/failed result for ``config``, or None when it may be timed: its constraint,
        then one run (finished on the device) checked against the reference."""
        reason = self.spec.config_problem(config, self.shape, self.dtype, self.device.chip.limits)
        if reason is not None:
            return TrialResult(config, invalid=reason)
        try:
            output = run_config(self.spec, self.inputs, config, self.shape, self.implementation)
            self.device.synchronize()  # a device's asynchronous error surfaces here, as this config's
        except Exception as error:  # a crashing config is a measurement, not a crash
            return TrialResult(config, error=f"{type(error).__name__}: {error}")
        mismatch = output_mismatch(output, self.expected, self.tolerance.atol, self.tolerance.rtol)
        return TrialResult(config, error=mismatch) if mismatch else None

    def evaluate(self, config: Config, best_known_ms: float | None = None) -> TrialResult:
        """Check then time ``config``; may stop early (``pruned``) if far slower than ``best_known_ms``
        (:func:`measure`). The checked run's time decides nothing: one cold call that allocates its
        outputs (on the 2-core VM 3x and more a warm call of a microsecond kernel) would prune the
        space's best configs, and the search would learn their region slow."""
        rejected = self.check(config)
        if rejected is not None:
            return rejected
        try:
            runner = self.runner(config)
            measurement = self.conditioned(
                lambda: [measure(runner, self.device, self.settings, best_known_ms)]
            )[0]
        except Exception as error:
            return TrialResult(config, error=f"{type(error).__name__}: {error}")
        if self.settings.against_default and not measurement.pruned:
            measurement = self.reference.rescale(config, measurement)
        return TrialResult(config, measurement=measurement)

    def compare(self, configs: Sequence[Config]) -> list[Measurement]:
        """Re-measure already-checked configs interleaved in one run (the validation run, with
        :meth:`BenchSettings.for_validation`), its rounds rotating between ``VALIDATION_INPUT_SETS``
        allocations of the inputs; same order as given."""
        settings = self.settings.for_validation()
        rotation = self.input_rotation(VALIDATION_INPUT_SETS)
        runners = [self.rotated_runner(c, rotation) for c in configs]
        return self.conditioned(
            lambda: measure_interleaved(runners, self.device, settings, before_round=rotation.select)
        )

    def _timed_with(self, config: Config, default: Config) -> list[Measurement]:
        """``config`` and ``default`` timed interleaved in one run (the search's settings)."""
        runners = [self.runner(config), self.runner(default)]
        return self.conditioned(lambda: measure_interleaved(runners, self.device, self.settings))

    def conditioned(self, take: Callable[[], list[Measurement]]) -> list[Measurement]:
        """``take()``'s measurements with the conditions they were taken in, taken again while the
        device's clock was low (:func:`~tiletune.kernels.conditions.measured_at_clock`)."""
        if self.read_conditions is None:
            return take()
        measurements, conditions = measured_at_clock(take, self.read_conditions)
        return [dataclasses.replace(m, conditions=conditions) for m in measurements]
