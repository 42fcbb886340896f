"""Bench results in the wire's terms: a trial's outcome, the final validation run's results.

A wrong or crashing config is an outcome (``invalid`` / ``error``), never an exception;
an interleaved run that crashes makes every config's result an error with the reason.
Imports the bench harness, the kernels' errors and the wire schemas.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import ValidationError

from tiletune.client.wire import Config, MeasurementWire, TrialOutcome, ValidatedConfig
from tiletune.kernels.errors import InputError
from tiletune.tuner.measure.bench import KernelBench
from tiletune.tuner.measure.measurement import Measurement, TrialResult


def wire_measurement(measurement: Measurement) -> MeasurementWire:
    """The wire form of a bench measurement (raises ``ValidationError`` for non-positive times)."""
    return MeasurementWire(**measurement.as_dict())


def outcome_of(trial_id: int, result: TrialResult) -> TrialOutcome:
    """A bench result as the outcome of trial ``trial_id``: measurement, else invalid, else error."""
    if result.measurement is not None:
        try:
            return TrialOutcome(trial_id=trial_id, measurement=wire_measurement(result.measurement))
        except ValidationError:
            return TrialOutcome(trial_id=trial_id, error=f"unusable measurement {result.measurement}")
    if result.invalid is not None:
        return TrialOutcome(trial_id=trial_id, invalid=result.invalid)
    return TrialOutcome(trial_id=trial_id, error=result.error or "no measurement and no reason given")


def _rejection(bench: KernelBench, config: Config) -> str | None:
    """Why ``config`` cannot be timed (outside the space, invalid, wrong), or None."""
    try:
        bench.spec.parse_config(config, bench.shape, bench.device.chip.limits)
    except InputError as error:
        return str(error)
    verdict = bench.check(config)
    return None if verdict is None else verdict.invalid or verdict.error or "rejected"


def validated_results(bench: KernelBench, configs: Sequence[Config]) -> list[ValidatedConfig]:
    """Check each config, then measure the good ones interleaved in one run; results in given order."""
    rejections = [_rejection(bench, config) for config in configs]
    runnable = [config for config, reason in zip(configs, rejections, strict=True) if reason is None]
    measurements: list[Measurement] = []
    try:
        measurements = bench.compare(runnable) if runnable else []
    except Exception as error:  # a crash of the interleaved run is a result, not a worker crash
        failure = f"interleaved run failed: {type(error).__name__}: {error}"
        rejections = [reason or failure for reason in rejections]
    measured = iter(measurements)
    results: list[ValidatedConfig] = []
    for config, reason in zip(configs, rejections, strict=True):
        if reason is not None:
            results.append(ValidatedConfig(config=config, error=reason))
            continue
        try:
            results.append(ValidatedConfig(config=config, measurement=wire_measurement(next(measured))))
        except ValidationError as error:
            results.append(ValidatedConfig(config=config, error=f"unusable measurement: {error}"))
    return results
