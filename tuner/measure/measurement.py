"""What a timing run found: a config's :class:`Measurement` (median, spread, sample count) and a
trial's :class:`TrialResult`.

A config timed alone is summarised from its own samples (:meth:`Measurement.from_samples`). Configs
timed interleaved in one run (:func:`~tiletune.tuner.measure.bench.measure_interleaved`: each round
one sample of each) are summarised by :func:`interleaved_measurements`: each its own median and
min, and a spread *net of the run's drift*. On a shared machine a slow moment slows every config of
a round alike; that common part says nothing about which config is faster, so it is taken out of
the spread that the judge's margin is made of (:func:`~tiletune.tuner.search.finalists.clearly_faster`).
On the 2-core VM this narrows the margin of two configs' medians (rms_norm 256x512: the standard error
of their difference 0.4-0.75 % of the median, against about 1 % from the plain spreads), so a real 5 %
gain is shown instead of lost in the noise.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tiletune.kernels.conditions import MeasurementConditions
from tiletune.kernels.declaration import Config


@dataclass(frozen=True)
class Measurement:
    """Statistics of repeated timed runs of one config, in milliseconds per launch.

    ``launches_per_sample``: the back-to-back calls each sample timed (its time divided by them).
    p10 and p90 of a config timed interleaved with others are its spread net of the run's drift
    (:func:`interleaved_measurements`).
    ``conditions``: the machine's state around the timed runs (governor, load, clocks), when read.
    """

    median_ms: float
    p10_ms: float
    p90_ms: float
    min_ms: float
    samples: int
    pruned: bool = False
    launches_per_sample: int = 1
    conditions: MeasurementConditions | None = None

    @classmethod
    def from_samples(
        cls, samples_ms: Sequence[float], pruned: bool = False, launches: int = 1
    ) -> Measurement:
        """Summarise raw samples (at least one), each the time per launch of ``launches`` calls."""
        ordered = sorted(samples_ms)
        return cls(
            median_ms=statistics.median(ordered),
            p10_ms=quantile(ordered, 0.10),
            p90_ms=quantile(ordered, 0.90),
            min_ms=ordered[0],
            samples=len(ordered),
            pruned=pruned,
            launches_per_sample=launches,
        )

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: the relative spread of the samples."""
        return (self.p90_ms - self.p10_ms) / self.median_ms if self.median_ms > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return {
            "median_ms": self.median_ms,
            "p10_ms": self.p10_ms,
            "p90_ms": self.p90_ms,
            "min_ms": self.min_ms,
            "samples": self.samples,
            "pruned": self.pruned,
            "launches_per_sample": self.launches_per_sample,
            **({"conditions": self.conditions.as_dict()} if self.conditions is not None else {}),
        }


@dataclass(frozen=True)
class TrialResult:
    """The outcome of evaluating one config: a measurement, or why there is none.

    ``invalid`` holds a constraint's reason (never run); ``error`` a run that
    crashed or returned a wrong result (run, then rejected).
    """

    config: Config
    measurement: Measurement | None = None
    invalid: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """True when the config ran, was correct and was measured."""
        return self.measurement is not None


def quantile(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``ordered`` (sorted, at least one value), linearly interpolated."""
    position = q * (len(ordered) - 1)
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def median_rel_ci(samples_ms: Sequence[float]) -> float:
    """Half-width of the distribution-free 95 % confidence interval of the median, relative to it.

    Uses the order statistics at ``n/2 ± 1.96·√n/2``; infinite below 5 samples.
    """
    n = len(samples_ms)
    if n < 5:
        return math.inf
    ordered = sorted(samples_ms)
    half = 1.96 * math.sqrt(n) / 2
    low = ordered[max(0, math.floor(n / 2 - half))]
    high = ordered[min(n - 1, math.ceil(n / 2 + half))]
    median = statistics.median(ordered)
    return (high - low) / (2 * median) if median > 0 else 0.0


def interleaved_measurements(rounds: Sequence[Sequence[float]], launches: Sequence[int]) -> list[Measurement]:
    """The measurements of one interleaved run: ``rounds[i][r]`` is config ``i``'s sample in round
    ``r`` (ms per launch, over ``launches[i]`` launches), every config one sample per round.

    Each config keeps its own median, min and sample count. Its p10 and p90 are its spread net of
    the run's drift: each sample is divided by its round's geometric mean over the configs, the
    10th and 90th percentiles of those quotients' logs are taken about their median, widened by
    ``sqrt(k / (k - 1))`` for ``k`` configs (the round's mean holds the config's own sample, which
    would hide part of its noise), and applied to the median. With one config, rounds of unequal
    length or a sample that is not positive, the plain spread (:meth:`Measurement.from_samples`).
    """
    plain = [
        Measurement.from_samples(samples, launches=n) for samples, n in zip(rounds, launches, strict=True)
    ]
    count = len(rounds)
    length = len(rounds[0]) if rounds else 0
    if count < 2 or any(len(samples) != length for samples in rounds):
        return plain
    if any(sample <= 0 for samples in rounds for sample in samples):
        return plain
    logs = [[math.log(sample) for sample in samples] for samples in rounds]
    drift = [statistics.fmean(config_logs[r] for config_logs in logs) for r in range(length)]
    widen = math.sqrt(count / (count - 1))
    corrected: list[Measurement] = []
    for measurement, config_logs in zip(plain, logs, strict=True):
        ordered = sorted(log - drift[r] for r, log in enumerate(config_logs))
        middle = statistics.median(ordered)
        corrected.append(
            dataclasses.replace(
                measurement,
                p10_ms=measurement.median_ms * math.exp(widen * (quantile(ordered, 0.10) - middle)),
                p90_ms=measurement.median_ms * math.exp(widen * (quantile(ordered, 0.90) - middle)),
            )
        )
    return corrected
