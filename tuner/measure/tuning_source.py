"""Tuning on the spot: a config source that tunes each key it meets, on this machine, with no server.

``TILETUNE_TUNE=1 python train.py`` makes the operators' source a :class:`TuningSource`
(:func:`tiletune.kernels.ops.source.configure` reads the switch):

- A key already in the file (``TILETUNE_TUNE_FILE``, default ``tiletune_configs.json`` in the
  working folder) is answered from it, exactly as a pinned bundle answers it: never tuned again.
- A key not in it is tuned when an operator first calls it, before the call runs: the local
  search of :func:`~tiletune.tuner.measure.tune.tune` (the default first, TPE,
  ``TILETUNE_TUNE_TRIALS`` trials, default 16, and at most ``TILETUNE_TUNE_TIME_S`` seconds per
  key when set), each config checked against the reference and measured in an isolated trial
  process as a worker's are (:class:`~tiletune.tuner.measure.isolation.TrialPool`, started when
  the source is made), though timed once (:func:`local_bench_settings`), and the judge of the
  interleaved validation run of its :data:`LOCAL_FINALISTS` best, the rule and torch's op: torch's
  own op wins unless a tiled config beats it. One line on stderr per key (kernel, shape, answer,
  speedup over torch's op, seconds taken).
- Each tuned key is written to the file at once (atomically, the whole bundle, in the export
  format ``tiletune configs export`` writes), so a run that is stopped keeps the keys finished,
  ``TILETUNE_PIN=<file>`` runs on them and ``tiletune configs import`` takes them into a server.
- A key whose tuning fails (no valid config ran, the device is unusable) is said once on stderr and
  runs untuned for the rest of the run (torch's op, as with no source); it is not written.

The answers are a :class:`~tiletune.client.ConfigClient`'s with no server, pinned to what is
known: a known key costs what a client's cache hit costs.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import optuna

from tiletune.client import ConfigClient
from tiletune.client.disk import read_bundle, write_bundle
from tiletune.client.tiling import Tiling
from tiletune.client.wire import BestConfigPublic, ConfigBundle
from tiletune.kernels.declaration import Shape
from tiletune.kernels.defaults import client_settings
from tiletune.kernels.device import Device, get_device
from tiletune.kernels.info import kernel_info
from tiletune.kernels.ops.dispatch import implementation
from tiletune.kernels.registry import get_kernel
from tiletune.tuner.measure.bench import BenchSettings
from tiletune.tuner.measure.isolation import TrialPool
from tiletune.tuner.measure.tune import TuneOptions, TuneReport, tune

logger = logging.getLogger(__name__)

#: The switch: ``1`` (or ``true``, ``yes``, ``on``) tunes each key the run meets.
TUNE_ENV = "TILETUNE_TUNE"
#: Trials per key (default :data:`DEFAULT_TRIALS`).
TRIALS_ENV = "TILETUNE_TUNE_TRIALS"
#: Seconds per key's search at most (default: no time limit, the trials alone).
TIME_ENV = "TILETUNE_TUNE_TIME_S"
#: The bundle file the tuned keys go to, and are read from (default :data:`DEFAULT_FILE`).
FILE_ENV = "TILETUNE_TUNE_FILE"
DEFAULT_TRIALS = 16
DEFAULT_FILE = "tiletune_configs.json"
#: Seconds of timed runs per trial of local tuning (a worker's: 0.4).
LOCAL_BUDGET_S = 0.1
#: The search's best configs re-measured beside the rule and torch's op in a key's validation run (a
#: worker's: 5). With search trials timed once, more of the top configs are near-ties, and each
#: finalist costs its share of the validation run (``docs/benchmarks.md#local_tune``: 3 or 5).
LOCAL_FINALISTS = 3
#: Trials per key at most (a typo of a few zeros must not hold a run for days).
MAX_TRIALS = 10_000

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})


def local_bench_settings() -> BenchSettings:
    """How local tuning measures: the worker's settings on a quarter of its timing budget
    (:data:`LOCAL_BUDGET_S`), and a search trial timed once, not again beside the default (a
    worker's ``against_default``, which cancels a shared machine's drift between trials and more than
    doubles a trial's time). A run waits for its keys; the validation run, where the top configs,
    the rule and torch's op are timed interleaved, still decides the answer."""
    return BenchSettings(budget_s=LOCAL_BUDGET_S, against_default=False)


class TuningSettingsError(ValueError):
    """A tuning setting that cannot be used; ``field`` names the environment variable or argument."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field, self.reason = field, reason


def switch_is_on(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether ``TILETUNE_TUNE`` asks for tuning; raises :class:`TuningSettingsError` for a value
    that is neither on (``1``, ``true``, ``yes``, ``on``) nor off (unset, empty, ``0``, ``false``,
    ``no``, ``off``)."""
    value = environ.get(TUNE_ENV, "").strip().lower()
    if value in _TRUE or value in _FALSE:
        return value in _TRUE
    raise TuningSettingsError(TUNE_ENV, f"must be 1 or 0 (or true/false), got {environ[TUNE_ENV]!r}")


@dataclass(frozen=True)
class TuningSettings:
    """Where tuned keys go and how much each may take (see the module docstring)."""

    path: Path = Path(DEFAULT_FILE)
    trials: int = DEFAULT_TRIALS
    time_s: float | None = None
    #: The measurement of each trial (:func:`local_bench_settings`).
    bench: BenchSettings = field(default_factory=local_bench_settings)
    #: The search's best configs re-measured in the validation run (:data:`LOCAL_FINALISTS`).
    finalists: int = LOCAL_FINALISTS

    def __post_init__(self) -> None:
        if not 1 <= self.trials <= MAX_TRIALS:
            raise TuningSettingsError(TRIALS_ENV, f"must be 1 to {MAX_TRIALS}, got {self.trials}")
        if self.time_s is not None and not 0 < self.time_s < float("inf"):
            raise TuningSettingsError(TIME_ENV, f"must be a positive number of seconds, got {self.time_s}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> TuningSettings:
        """The settings ``TILETUNE_TUNE_*`` give; :class:`TuningSettingsError` names a bad one."""
        trials, time_s = environ.get(TRIALS_ENV, "").strip(), environ.get(TIME_ENV, "").strip()
        try:
            count = int(trials) if trials else DEFAULT_TRIALS
        except ValueError:
            raise TuningSettingsError(TRIALS_ENV, f"must be a whole number, got {trials!r}") from None
        try:
            seconds = float(time_s) if time_s else None
        except ValueError:
            raise TuningSettingsError(TIME_ENV, f"must be a number of seconds, got {time_s!r}") from None
        path = Path(environ.get(FILE_ENV, "").strip() or DEFAULT_FILE)
        return cls(path=path, trials=count, time_s=seconds)


@dataclass(frozen=True)
class KeyTuned:
    """One key's tuning, as its progress line says it: the answer, or why there is none."""

    kernel: str
    shape: str
    dtype: str
    seconds: float
    report: TuneReport | None = None
    error: str | None = None

    def line(self) -> str:
        """The progress line, e.g. ``tiletune: tuned matmul m=8,n=8,k=8,... float32: torch's op, 1.00x
        torch's op, 16 trials (4.2 s)``."""
        key = f"{self.kernel} {self.shape} {self.dtype}"
        if self.report is None:
            return f"tiletune: could not tune {key} ({self.seconds:.1f} s): {self.error}; it runs untuned"
        report = self.report
        answer = "torch's op" if report.implementation == "vendor" else f"{report.implementation} tiles"
        speedup = report.speedup_vs_vendor
        versus = f"{speedup:.2f}x torch's op" if speedup is not None else "torch has no op here"
        trials = report.counts.get("completed", 0)
        return f"tiletune: tuned {key}: {answer}, {versus}, {trials} trials ({self.seconds:.1f} s)"


class TuningSource:
    """A config source (``get(kernel, shape, dtype=...)``) that tunes each key it meets; see the
    module docstring. Thread-safe; keys are tuned one at a time. ``close`` ends the trial process."""

    def __init__(self, settings: TuningSettings, device: Device | None = None) -> None:
        self.settings = settings
        self.device = device or get_device("auto")
        self.client = ConfigClient(None, self.device.chip.name, settings=client_settings(cache_dir=None))
        self.tuned: list[KeyTuned] = []
        #: The keys asked so far: (kernel, dtype, shape items).
        self.met: set[tuple[str, str, tuple[tuple[str, int], ...]]] = set()
        self._entries = self._read_file()
        self._failed: set[tuple[str, str, tuple[tuple[str, int], ...]]] = set()
        self._lock = threading.RLock()
        self._tuning = threading.local()
        self._pool = TrialPool()
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # one line per key says it: as the CLI does
        self._publish()
        self.client.pin()
        self._pool.process.start()  # its imports overlap with the run until the first key

    def _read_file(self) -> list[BestConfigPublic]:
        """The entries of the settings' file (none when it does not exist); raises
        :class:`TuningSettingsError` for a file that is not a bundle of this chip."""
        path = self.settings.path
        if not path.exists():
            return []
        try:
            bundle = read_bundle(path)
        except (OSError, ValueError) as error:
            raise TuningSettingsError(FILE_ENV, f"{path} is not a tiletune bundle: {error}") from None
        if bundle.chip not in (None, self.client.chip):
            here = self.client.chip
            reason = f"{path} holds configs of chip {bundle.chip!r}, not of {here!r}"
            raise TuningSettingsError(FILE_ENV, reason)
        return list(bundle.configs)

    def _bundle(self) -> ConfigBundle:
        names = sorted({entry.kernel for entry in self._entries})
        limits = self.device.chip.limits
        return ConfigBundle(
            exported_at=datetime.now(UTC),
            chip=self.client.chip,
            kernels=[kernel_info(get_kernel(name), limits) for name in names],
            configs=self._entries,
        ).sealed()

    def _publish(self) -> None:
        """Hand every entry to the client (its answers come from them)."""
        self.client.core.take_bundle(self._bundle())

    def get(self, kernel: str, shape: Mapping[str, int], /, *, dtype: str) -> Tiling:
        """The answer for the key: from the file, else tuned now (see the module docstring)."""
        key = (kernel, dtype, tuple(shape.items()))
        self.met.add(key)
        answer = self.client.get(kernel, shape, dtype)
        if answer.match == "exact" or getattr(self._tuning, "active", False):
            return answer
        with self._lock:
            answer = self.client.get(kernel, shape, dtype)  # another thread may have tuned it
            if answer.match == "exact" or key in self._failed:
                return answer
            done = self.tune_key(kernel, dict(shape), dtype)
            if done.report is None:
                self._failed.add(key)
            return self.client.get(kernel, shape, dtype)

    def tune_key(self, kernel: str, shape: Mapping[str, int], dtype: str) -> KeyTuned:
        """Tune one key now, write it to the file and say so on stderr; never raises but for
        ``KeyboardInterrupt`` (the file keeps the keys finished before)."""
        started = time.monotonic()
        self._tuning.active = True
        try:
            spec = get_kernel(kernel)
            parsed: Shape = spec.parse_shape(dict(shape))
            _, backend = implementation(kernel, self.device.kind)  # what the operators run it with
            options = self._options()
            report = tune(spec, parsed, dtype, self.device, options, backend=backend, isolation=self._pool)
            done = KeyTuned(kernel, spec.canonical_shape(parsed), dtype, time.monotonic() - started, report)
            self._add(self._entry(report))
        except Exception as error:  # the run goes on untuned for this key
            shape_text = ",".join(f"{k}={v}" for k, v in shape.items())
            reason = str(error) or repr(error)
            done = KeyTuned(kernel, shape_text, dtype, time.monotonic() - started, error=reason)
        finally:
            self._tuning.active = False
        self.tuned.append(done)
        print(done.line(), file=sys.stderr, flush=True)
        return done

    def _options(self) -> TuneOptions:
        settings = self.settings
        return TuneOptions(
            trials=settings.trials,
            max_time_s=settings.time_s,
            bench=settings.bench,
            validate_top=settings.finalists,
        )

    def _entry(self, report: TuneReport) -> BestConfigPublic:
        spec = get_kernel(report.kernel)
        default = report.default
        return BestConfigPublic(
            kernel=report.kernel,
            kernel_version=report.kernel_version,
            shape=report.shape,
            shape_key=spec.canonical_shape(report.shape),
            dtype=report.dtype,
            chip=self.client.chip,
            config=report.best_config,
            median_ms=report.best.median_ms,
            default_config=report.default_config,
            default_ms=default.median_ms if default is not None else None,
            speedup_vs_default=report.speedup_vs_default,
            software=report.software,
            promoted_at=datetime.now(UTC),
        )

    def _add(self, entry: BestConfigPublic) -> None:
        """Keep ``entry`` (replacing one of its key), write the file, answer from it."""

        def key(e: BestConfigPublic) -> tuple[str, int, str, str]:
            return (e.kernel, e.kernel_version, e.shape_key, e.dtype)

        self._entries = [e for e in self._entries if key(e) != key(entry)]
        self._entries.append(entry)
        bundle = self._bundle()
        write_bundle(self.settings.path, bundle)
        self.client.core.take_bundle(bundle)

    def close(self) -> None:
        """End the trial process (a later key starts another)."""
        self._pool.close()


def source_from_env(environ: Mapping[str, str] = os.environ) -> TuningSource:
    """The source ``TILETUNE_TUNE=1`` asks for, with the ``TILETUNE_TUNE_*`` settings."""
    source = TuningSource(TuningSettings.from_env(environ))
    logger.info(
        "tiletune: tuning each new key on %s (%d trials each) into %s",
        source.client.chip,
        source.settings.trials,
        source.settings.path,
    )
    return source
