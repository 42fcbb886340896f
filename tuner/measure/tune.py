"""Local tuning: search a kernel's space on this machine and validate the winner.

``tune`` drives a :class:`~tiletune.tuner.search.search.Search` (Optuna ask-and-tell)
with a :class:`~tiletune.tuner.measure.bench.KernelBench`: the default config is the
first trial, invalid configs are never run, every measured config is checked
against the reference first. When the search stops (trial budget, time budget
or convergence), the top few configs, the default and torch's own op (the vendor
config, where the kernel has one) are re-measured interleaved in one run; the fastest
of those that beats torch's op and the default beyond that run's spread is the answer,
else torch's op (else the default), so the best config is never slower than either
(the policy is :mod:`tiletune.tuner.search.finalists`', the
server's too). A kernel whose configs are builds has each config built before it is checked and
timed, and the search asks a few trials ahead so they build while one is measured
(:mod:`tiletune.tuner.measure.build_ahead`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from tiletune.client.chip import software_fingerprint
from tiletune.client.space import is_vendor, vendor_config
from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.device import Device
from tiletune.kernels.spec import KernelSpec
from tiletune.tuner.measure.bench import BenchSettings, KernelBench
from tiletune.tuner.measure.build_ahead import shared_build_ahead
from tiletune.tuner.measure.isolation import TrialPool
from tiletune.tuner.measure.measurement import Measurement, TrialResult
from tiletune.tuner.measure.replay import ReplaySpace
from tiletune.tuner.search.finalists import Timing, finalists, judge
from tiletune.tuner.search.search import Search, SearchSpace, TpeOptions
from tiletune.tuner.search.trials import Candidate

R = TypeVar("R")

#: Called after each trial with (unique valid measurements so far, best time so far in ms).
Progress = Callable[[int, float | None], None]


@dataclass(frozen=True)
class TuneOptions:
    """How to search: strategy, budgets and measurement settings.

    ``seeds`` are configs measured right after the default, before anything
    the strategy picks (a known good config gives the measurement's pruning
    a good best from the start; invalid ones are skipped). ``tpe`` overrides
    the ``tpe`` strategy's options (``None``: its defaults).
    """

    strategy: str = "tpe"
    trials: int | None = 40
    max_time_s: float | None = None
    patience: int | None = None
    seed: int | None = 0
    validate_top: int = 5
    bench: BenchSettings = field(default_factory=BenchSettings)
    seeds: tuple[Config, ...] = ()
    tpe: TpeOptions | None = None


@dataclass(frozen=True)
class TracePoint:
    """One measured trial of the search phase, for convergence plots and time-to-best."""

    elapsed_s: float
    config: Config
    median_ms: float


@dataclass
class TuneReport:
    """What local tuning found; ``as_dict`` is the CLI's JSON contract."""

    kernel: str
    kernel_version: int
    shape: Shape
    dtype: str
    chip: str
    backend: str
    strategy: str
    space_size: int
    counts: dict[str, int]
    best_config: Config
    best: Measurement
    default_config: Config
    default: Measurement | None
    default_invalid: str | None
    validated: list[tuple[Config, Measurement]]
    wall_s: float
    trace: list[TracePoint]
    software: dict[str, str | None] = field(default_factory=software_fingerprint)
    #: torch's op in the validation run (None: the kernel has none here, or it did not run).
    vendor: Measurement | None = None
    #: Seconds per phase: ``prepare`` (the bench: inputs, reference, the default's check; a fresh
    #: trial process's start), ``trials`` (configs built, checked and measured), ``search`` (the
    #: strategy's asks and tells), ``validate`` (the interleaved validation run).
    phases: dict[str, float] = field(default_factory=dict)

    @property
    def implementation(self) -> str:
        """What the best config runs: ``vendor`` (torch's op) or the backend of the tiled configs."""
        return "vendor" if is_vendor(self.best_config) else self.backend

    @property
    def speedup_vs_default(self) -> float | None:
        """Default's median over the best's median, both from the same interleaved run."""
        return self.default.median_ms / self.best.median_ms if self.default else None

    @property
    def speedup_vs_vendor(self) -> float | None:
        """torch's op's median over the best's median, both from the same interleaved run."""
        return self.vendor.median_ms / self.best.median_ms if self.vendor else None

    def as_dict(self) -> dict[str, Any]:
        """The JSON document of ``tiletune tune --json``."""
        return {
            "kernel": self.kernel,
            "kernel_version": self.kernel_version,
            "shape": self.shape,
            "dtype": self.dtype,
            "chip": self.chip,
            "backend": self.backend,
            "software": self.software,
            "strategy": self.strategy,
            "space_size": self.space_size,
            "trials": self.counts,
            "best": {
                "config": self.best_config,
                "implementation": self.implementation,
                **self.best.as_dict(),
            },
            "default": {
                "config": self.default_config,
                **(self.default.as_dict() if self.default else {"median_ms": None}),
                "invalid": self.default_invalid,
            },
            "speedup_vs_default": self.speedup_vs_default,
            "vendor": self.vendor.as_dict() if self.vendor else None,
            "speedup_vs_vendor": self.speedup_vs_vendor,
            "validated": [{"config": c, **m.as_dict()} for c, m in self.validated],
            "wall_s": self.wall_s,
            "phases": self.phases,
        }


def run_search(
    search: Search,
    evaluate: Callable[[Config, float | None], TrialResult],
    progress: Progress | None = None,
    clock: Callable[[], float] = time.monotonic,
    *,
    ahead: int = 0,
    prepare: Callable[[list[Config]], object] | None = None,
) -> tuple[dict[str, TrialResult], list[TracePoint]]:
    """Ask, evaluate and tell until the search is done; every result by config key, and the trace.

    ``ahead``: candidates asked beyond the one evaluated (0: one at a time), each handed to
    ``prepare`` when asked (a kernel whose configs are builds builds them meanwhile). Candidates
    still asked when the search is done are left unmeasured.
    """
    results: dict[str, TrialResult] = {}
    trace: list[TracePoint] = []
    start = clock()
    queued: list[Candidate] = []
    while not search.done:
        asked = search.ask(1 + ahead - len(queued)) if len(queued) <= ahead else []
        if asked and prepare is not None:
            prepare([candidate.config for candidate in asked])
        queued += asked
        if not queued:
            break
        candidate = queued.pop(0)
        best = search.best(1)
        result = evaluate(candidate.config, best[0][1] if best else None)
        results[config_key(candidate.config)] = result
        if result.measurement is not None:
            search.tell(candidate.trial_id, result.measurement.median_ms)
            trace.append(TracePoint(clock() - start, candidate.config, result.measurement.median_ms))
        else:
            search.tell(candidate.trial_id, None, result.error or result.invalid)
        if progress is not None:
            best = search.best(1)
            progress(search.counts.completed, best[0][1] if best else None)
    return results, trace


def config_key(config: Config) -> str:
    """A stable string for a config (knob order as declared)."""
    return ",".join(f"{k}={v}" for k, v in config.items())


def _search(space: SearchSpace, options: TuneOptions) -> Search:
    return Search(
        space,
        strategy=options.strategy,
        seed=options.seed,
        max_trials=None if options.strategy == "grid" else options.trials,
        max_time_s=options.max_time_s,
        patience=options.patience,
        options=options.tpe,
    )


def tune(
    spec: KernelSpec,
    shape: Shape,
    dtype: str,
    device: Device,
    options: TuneOptions = TuneOptions(),
    *,
    backend: str | None = None,
    progress: Progress | None = None,
    isolation: TrialPool | None = None,
) -> TuneReport:
    """Tune ``spec`` for ``shape``/``dtype`` on ``device`` (see the module); with ``isolation`` in its
    trial process as a worker does (:class:`~tiletune.tuner.measure.isolation.DeviceUnusableError`
    when a fresh one cannot run the default), else in this process."""
    started = time.monotonic()
    limits = device.chip.limits
    default = spec.default_config(shape, dtype, limits)
    space = SearchSpace(
        knobs=spec.knob_values(shape, limits),
        invalid_reason=lambda config: spec.invalid_reason(config, shape, dtype, limits),
        seeds=[default, *options.seeds],
    )
    search = _search(space, options)
    builds = shared_build_ahead()  # a kernel whose configs are builds: built ahead, never while timed
    clock = PhaseClock()
    bench = _bench(spec, shape, dtype, device, settings=options.bench, backend=backend, isolation=isolation)
    clock.lap("prepare")
    evaluate = clock.timed("trials", partial(builds.evaluate, bench))
    results, trace = run_search(
        search, evaluate, progress, ahead=builds.depth(spec), prepare=partial(builds.submit, bench)
    )
    if not search.best(1):
        raise RuntimeError(f"no valid config of {spec.name} ran correctly for {spec.canonical_shape(shape)}")

    default_result = results.get(config_key(default)) or evaluate(default)
    clock.lap("search")
    top = [config for config, _ in search.best(options.validate_top)]
    validation = validate(bench, top, default, default_ok=default_result.ok)
    clock.lap("validate")
    return TuneReport(
        kernel=spec.name,
        kernel_version=spec.version,
        shape=shape,
        dtype=dtype,
        chip=device.chip.name,
        backend=bench.implementation,
        strategy=options.strategy,
        space_size=len(spec.space(shape, dtype, limits)),
        counts=search.counts.as_dict(),
        best_config=validation.best_config,
        best=validation.best,
        default_config=default,
        default=validation.default,
        default_invalid=None if default_result.ok else (default_result.invalid or default_result.error),
        validated=validation.runs,
        wall_s=time.monotonic() - started,
        trace=trace,
        vendor=validation.vendor,
        phases=clock.seconds,
    )


class PhaseClock:
    """Seconds spent per phase: :meth:`lap` charges the time since the last lap to a phase, less the
    time of the :meth:`timed` calls made meanwhile, which their own phase gets."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._mark = time.monotonic()
        self._inner = 0.0

    def lap(self, phase: str) -> None:
        """Charge the time since the last lap (less the timed calls') to ``phase``."""
        now = time.monotonic()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self._mark - self._inner
        self._mark, self._inner = now, 0.0

    def timed(self, phase: str, function: Callable[..., R]) -> Callable[..., R]:
        """``function``, each call's time charged to ``phase``."""

        def call(*args: Any, **kwargs: Any) -> R:
            start = time.monotonic()
            try:
                return function(*args, **kwargs)
            finally:
                spent = time.monotonic() - start
                self.seconds[phase] = self.seconds.get(phase, 0.0) + spent
                self._inner += spent

        return call


def _bench(
    spec: KernelSpec,
    shape: Shape,
    dtype: str,
    device: Device,
    *,
    settings: BenchSettings,
    backend: str | None,
    isolation: TrialPool | None,
) -> KernelBench:
    """The bench of a local tuning: in this process, or in ``isolation``'s trial process (the
    default's build readied here first, so the child times no compile)."""
    if isolation is None:
        return KernelBench(spec, shape, dtype, device, backend, settings)
    shared_build_ahead().ready_default(spec, shape, dtype, device.chip.limits)
    return isolation.bench(spec, shape, dtype, device, backend=backend, settings=settings)


@dataclass(frozen=True)
class Validation:
    """The validation run of a local tuning: each finalist with its measurement, the judge's answer,
    and the default's and torch's op's measurements there (None: not in the run)."""

    runs: list[tuple[Config, Measurement]]
    best_config: Config
    best: Measurement
    default: Measurement | None
    vendor: Measurement | None


def validate(bench: KernelBench, top: list[Config], default: Config, *, default_ok: bool) -> Validation:
    """The ``top`` configs, the default (where it ran correctly) and torch's op (where the kernel has
    one here: :func:`vendor_candidate`) measured interleaved in one run and judged
    (:func:`~tiletune.tuner.search.finalists.judge`)."""
    vendor = vendor_candidate(bench)
    configs = finalists(top, default if default_ok else None, vendor=vendor)
    runs = list(zip(configs, bench.compare(configs), strict=True))
    verdict = judge(
        [Timing(c, m.median_ms, m.p90_ms, m.p10_ms, m.samples) for c, m in runs], default, vendor=vendor
    )
    assert verdict is not None  # the top configs ran correctly in the search

    def measured(config: Config | None) -> Measurement | None:
        return next((m for c, m in runs if config is not None and c == config), None)

    best = measured(verdict.winner)
    assert best is not None  # the judge answers a config of the run
    return Validation(runs, verdict.winner, best, measured(default), measured(vendor))


def vendor_candidate(bench: KernelBench) -> Config | None:
    """The vendor config when torch's op is one of the bench's kernel's implementations, runs here
    and gives the reference's result (:meth:`KernelBench.check`); else None."""
    if not bench.spec.has_vendor:
        return None
    config = vendor_config()
    return config if bench.check(config) is None else None


def tune_replay(
    space: ReplaySpace, options: TuneOptions = TuneOptions(), progress: Progress | None = None
) -> TuneReport:
    """Tune on a recorded space: a config's "measurement" is its recorded time (no noise, no hardware).

    Kernel Tuner records no default config, so the config of median recorded
    time stands in for a hand-written default (it is also the search's seed).
    No validation run is needed: replayed times do not drift.
    """
    started = time.monotonic()
    default = space.median_config()

    def evaluate(config: Config, best_known_ms: float | None) -> TrialResult:
        outcome = space.measure(config)
        if outcome.time_ms is None:
            return TrialResult(config, error=outcome.error)
        return TrialResult(config, measurement=Measurement.from_samples([outcome.time_ms]))

    search = _search(space.search_space(seeds=[default]), options)
    _, trace = run_search(search, evaluate, progress)
    best_config, best_ms = search.best(1)[0]
    default_measurement = Measurement.from_samples([space.time_ms(default)])
    best = Measurement.from_samples([best_ms])
    return TuneReport(
        kernel=space.name,
        kernel_version=1,
        shape={},
        dtype="recorded",
        chip=f"replay/{space.device_name}",
        backend="replay",
        strategy=options.strategy,
        space_size=space.valid_count,
        counts=search.counts.as_dict(),
        best_config=best_config,
        best=best,
        default_config=default,
        default=default_measurement,
        default_invalid=None,
        validated=[(best_config, best), (default, default_measurement)][: 1 if best_config == default else 2],
        wall_s=time.monotonic() - started,
        trace=trace,
        software={"replay_file": str(space.path)},
    )
