"""The replay bench: a :class:`~tiletune.tuner.measure.bench.KernelBench` whose measurement is a lookup.

For a replay kernel (:class:`~tiletune.kernels.replay.spec.ReplayKernelSpec`) on a replay
device (:class:`~tiletune.kernels.device.ReplayDevice`), so the worker drives it exactly like
a real bench (``evaluate``, ``check``, ``compare``, :func:`~tiletune.tuner.measure.result.validated_results`):

- ``evaluate(config)``: outside the recorded region -> ``invalid`` (never "run"); a recorded
  failure -> ``error`` with its name (``RuntimeFailedConfig``); otherwise a measurement of one
  sample, the variant's recorded time (:meth:`ReplayKernelSpec.recorded`), never pruned;
- ``check(config)``: the same verdicts, without a measurement;
- ``compare(configs)`` (the validation run): the same times again, in the given order; a
  recorded failure among them raises ``RecordedFailureError`` (the caller's error result);
- each "run" config (measured or failed, in ``evaluate`` and ``compare``) first spends the
  device's simulated trial duration (:meth:`ReplayDevice.occupy`; 0 by default).

No inputs, no reference, no torch tensor, no timing loop: a trial costs microseconds. Built
with a spec or device of another kind it raises ``TypeError``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tiletune.kernels.declaration import Config
from tiletune.kernels.device import ReplayDevice
from tiletune.kernels.replay.declaration import REPLAY_KIND
from tiletune.kernels.replay.recorded import RecordedFailureError
from tiletune.kernels.replay.spec import NotRunnableError, ReplayKernelSpec
from tiletune.tuner.measure.bench import KernelBench
from tiletune.tuner.measure.measurement import Measurement, TrialResult


class ReplayBench(KernelBench):
    """Looks configs of one replay kernel and variant up (see the module docstring)."""

    def __post_init__(self) -> None:
        if not isinstance(self.spec, ReplayKernelSpec):
            raise TypeError(f"a replay bench needs a replay kernel, not {self.spec.name!r}")
        if not isinstance(self.device, ReplayDevice):
            raise TypeError(f"a replay bench needs a replay device, not {self.device.kind!r}")
        self.implementation = REPLAY_KIND
        self.replay_spec: ReplayKernelSpec = self.spec
        self.replay_device: ReplayDevice = self.device

    def runner(self, config: Config) -> Callable[[], object]:
        """Raises ``NotRunnableError``: nothing runs on a replay device."""
        raise NotRunnableError(f"kernel {self.spec.name!r} is a recorded space: it is looked up, never run")

    def check(self, config: Config) -> TrialResult | None:
        """An invalid (not recorded) or failed (recorded failure) result, or None when it has a time."""
        outcome = self.replay_spec.lookup(config, self.shape)
        if outcome is None:
            return TrialResult(config, invalid=self._invalid_reason(config))
        return None if outcome.time_ms is not None else TrialResult(config, error=outcome.error)

    def evaluate(self, config: Config, best_known_ms: float | None = None) -> TrialResult:
        """The recorded outcome of ``config`` (``best_known_ms`` is ignored: nothing is pruned)."""
        outcome = self.replay_spec.lookup(config, self.shape)
        if outcome is None:
            return TrialResult(config, invalid=self._invalid_reason(config))
        self.replay_device.occupy()
        if outcome.time_ms is None:
            return TrialResult(config, error=outcome.error)
        return TrialResult(config, measurement=_one_sample(outcome.time_ms))

    def compare(self, configs: Sequence[Config]) -> list[Measurement]:
        """The recorded times of already-checked configs, in the given order (one sample each)."""
        measurements: list[Measurement] = []
        for config in configs:
            self.replay_device.occupy()
            outcome = self.replay_spec.recorded(config, self.shape)
            if outcome.time_ms is None:
                raise RecordedFailureError(f"config {config}: {outcome.error}")
            measurements.append(_one_sample(outcome.time_ms))
        return measurements

    def _invalid_reason(self, config: Config) -> str:
        reason = self.spec.invalid_reason(config, self.shape, self.dtype, self.device.chip.limits)
        return reason or "not in the recorded space"


def _one_sample(time_ms: float) -> Measurement:
    """A measurement of one exact sample (what :meth:`Measurement.from_samples` gives, without sorting)."""
    return Measurement(median_ms=time_ms, p10_ms=time_ms, p90_ms=time_ms, min_ms=time_ms, samples=1)
