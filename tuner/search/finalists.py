"""The finalist and winner policy, one for local tuning and for the server.

When a search stops, its top configs, the kernel's default, the key's current best (the
incumbent, on a server) and torch's own op (the vendor config, where the kernel has one) are
re-measured interleaved in one run (:func:`finalists`), and :func:`judge` decides from that run
alone (times taken minutes apart never decide): a config replaces torch's op (or, without one, the
default), and then the incumbent, only when it is faster *beyond the run's noise* and by a minimum
gain (:func:`clearly_faster`) than torch's op and than the default; otherwise torch's op (or the
default, or the incumbent) stays the answer, so a tuned config is never an answer slower than
torch's op or the rule it replaces. Pure functions, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from tiletune.client.wire import Config


def finalists(
    top: Sequence[Config],
    default: Config | None,
    incumbent: Config | None = None,
    vendor: Config | None = None,
) -> list[Config]:
    """``top`` (best first), then the default, the incumbent and the vendor config, each once."""
    unique: list[Config] = []
    for config in [*top, *(c for c in (default, incumbent, vendor) if c is not None)]:
        if config not in unique:
            unique.append(dict(config))
    return unique


class Timing(NamedTuple):
    """One config's statistics in a validation run, in ms per launch: the median, the 90th and
    10th percentiles and the number of samples (each None when unknown; see :func:`clearly_faster`)."""

    config: Config
    median_ms: float
    p90_ms: float | None = None
    p10_ms: float | None = None
    samples: int | None = None


#: A config must beat the other's median by at least this fraction, whatever the run's precision:
#: the error of a median within one run does not cover what changes between runs (another moment's
#: load), so a smaller gain is not promised to hold. The placement of the buffers is in the run's
#: error since a validation run rotates between allocations of the inputs (``VALIDATION_INPUT_SETS``):
#: 3 % before: in runs 27-30 of ``benchmarks/tuning_quality.py --quick`` (64 keys in all) it kept the
#: default four times where the exhaustive best was 2-7 % faster in every final run; at 2 % the same
#: validation runs take those four (and one config the final runs did not time), nothing slower.
MIN_GAIN = 0.02
#: How many standard errors of the two medians' difference the gain must clear, besides ``MIN_GAIN``.
ERRORS = 2.0
#: median - p10 of a normal distribution, in standard deviations.
_P10_SIGMAS = 1.2816
#: The standard error of a sample median is this times sigma / sqrt(n) (normal samples).
_MEDIAN_EFFICIENCY = 1.2533


def median_error(timing: Timing) -> float | None:
    """The standard error of ``timing``'s median, from the spread below it (median - p10) and the
    sample count (None when either is unknown). Interference only adds time: the slow tail
    (descheduling, another process) moves the median little, while the fast side is the spread of
    the samples around it, so the tail does not widen the margin; p90 is not used."""
    if timing.p10_ms is None or not timing.samples:
        return None
    sigma = max(timing.median_ms - timing.p10_ms, 0.0) / _P10_SIGMAS
    return _MEDIAN_EFFICIENCY * sigma / math.sqrt(timing.samples)


def clearly_faster(a: Timing, b: Timing) -> bool:
    """True when ``a`` beats ``b`` beyond the run's noise and by a gain that holds across runs.

    ``a``'s median must be below ``b``'s by ``MIN_GAIN`` of it plus ``ERRORS`` standard errors of
    the difference of the two medians (:func:`median_error`; the samples of one interleaved run).
    Where a timing lacks its p10 or sample count (an older worker), the rule is the cautious one:
    ``a``'s p90 below ``b``'s median.
    """
    a_error, b_error = median_error(a), median_error(b)
    if a_error is None or b_error is None:
        a_p90 = a.p90_ms if a.p90_ms is not None else a.median_ms
        return a_p90 < b.median_ms
    margin = ERRORS * math.hypot(a_error, b_error)
    return a.median_ms < b.median_ms * (1 - MIN_GAIN) - margin


@dataclass(frozen=True)
class Verdict:
    """What one interleaved validation run decided: the key's answer after it (``winner``), its
    median, the default's and torch's op's (None: not measured), and whether it replaces the
    incumbent."""

    winner: Config
    winner_ms: float
    default_ms: float | None
    promote: bool
    vendor_ms: float | None = None


def judge(
    measured: Sequence[Timing],
    default: Config | None,
    incumbent: Config | None = None,
    vendor: Config | None = None,
) -> Verdict | None:
    """The run's answer and whether it replaces the incumbent; ``None`` when nothing ran.

    The baseline is torch's op (``vendor``) where it ran, else the default. The answer is the
    fastest (by median) of the configs :func:`clearly_faster` than the baseline and than the
    default (each that ran; the default itself needs only beat torch's op), else the baseline;
    with neither measured, the fastest of the run. A measured incumbent stays the answer
    (``promote`` False) unless that answer is clearly faster than it; with no incumbent, or one
    that did not run, the answer is promoted.
    """
    if not measured:
        return None

    def timing_of(config: Config | None) -> Timing | None:
        return next((t for t in measured if config is not None and t.config == config), None)

    def beats(timing: Timing, bar: Timing | None) -> bool:
        return bar is None or timing.config == bar.config or clearly_faster(timing, bar)

    default_timing, vendor_timing = timing_of(default), timing_of(vendor)
    baseline = vendor_timing or default_timing
    contenders = [
        t for t in measured if t is not baseline and beats(t, default_timing) and beats(t, vendor_timing)
    ]
    answer = min(contenders, key=lambda t: t.median_ms) if contenders else baseline
    assert answer is not None
    held = timing_of(incumbent)
    if held is not None and held.config != answer.config and not clearly_faster(answer, held):
        answer = held
    promote = held is None or held.config != answer.config
    return Verdict(
        dict(answer.config),
        answer.median_ms,
        default_timing.median_ms if default_timing is not None else None,
        promote,
        vendor_timing.median_ms if vendor_timing is not None else None,
    )
