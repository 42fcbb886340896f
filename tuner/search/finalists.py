"""The finalist and winner policy, one for local tuning and for the server.

When a search stops, its top configs, the kernel's default and the key's current best (the
incumbent, on a server) are re-measured interleaved in one run (:func:`finalists`), and
:func:`judge` decides from that run alone (times taken minutes apart never decide): a config
replaces the default, and then the incumbent, only when it is faster *beyond the measured
spread* (:func:`clearly_faster`); otherwise the default (or the incumbent) stays the answer,
so a tuned config is never an answer slower than the rule it replaces. Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from tiletune.client.wire import Config


def finalists(top: Sequence[Config], default: Config | None, incumbent: Config | None = None) -> list[Config]:
    """``top`` (best first), then the default, then the incumbent, each once."""
    unique: list[Config] = []
    for config in [*top, *(c for c in (default, incumbent) if c is not None)]:
        if config not in unique:
            unique.append(dict(config))
    return unique


class Timing(NamedTuple):
    """One config's median and 90th percentile in a validation run, in ms per launch (``p90_ms``
    None when unknown: read as the median)."""

    config: Config
    median_ms: float
    p90_ms: float | None = None


def clearly_faster(a: Timing, b: Timing) -> bool:
    """True when ``a`` beats ``b`` beyond the run's spread: ``a``'s p90 is below ``b``'s median.

    At least nine in ten of ``a``'s samples were faster than ``b``'s typical sample in the same
    interleaved run. The margin scales with the measured noise, not with the number of samples:
    a confidence interval of the medians narrows as 1/√n and would promote a 1 % gain that a
    later run (other buffers, another moment's load) does not reproduce, whereas an answer must
    stay no slower than the one it replaces in later runs too. With multi-launch samples
    (``BenchSettings.min_sample_ms``) the spread, hence the margin, is a few percent.
    """
    a_p90 = a.p90_ms if a.p90_ms is not None else a.median_ms
    return a_p90 < b.median_ms


@dataclass(frozen=True)
class Verdict:
    """What one interleaved validation run decided: the key's answer after it (``winner``), its
    median and the default's (None: not measured), and whether it replaces the incumbent."""

    winner: Config
    winner_ms: float
    default_ms: float | None
    promote: bool


def judge(
    measured: Sequence[Timing], default: Config | None, incumbent: Config | None = None
) -> Verdict | None:
    """The run's answer and whether it replaces the incumbent; ``None`` when nothing ran.

    The answer is the fastest (by median) of the configs :func:`clearly_faster` than the
    default, else the default; with no measured default, the fastest of the run. A measured
    incumbent stays the answer (``promote`` False) unless that answer is clearly faster than
    it; with no incumbent, or one that did not run, the answer is promoted.
    """
    if not measured:
        return None
    baseline = next((t for t in measured if default is not None and t.config == default), None)
    contenders = [t for t in measured if baseline is None or clearly_faster(t, baseline)]
    answer = min(contenders, key=lambda t: t.median_ms) if contenders else baseline
    assert answer is not None
    held = next((t for t in measured if incumbent is not None and t.config == incumbent), None)
    if held is not None and held.config != answer.config and not clearly_faster(answer, held):
        answer = held
    promote = held is None or held.config != answer.config
    default_ms = baseline.median_ms if baseline is not None else None
    return Verdict(dict(answer.config), answer.median_ms, default_ms, promote)
