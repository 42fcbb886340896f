"""The finalist and winner policy, one for local tuning and for the server.

When a search stops, its top configs, the kernel's default and the key's current best (the
incumbent, on a server) are re-measured interleaved in one run (:func:`finalists`); the
fastest of that run is the answer (:func:`judge`). It replaces the incumbent only when it
beats the incumbent's time *in that same run* (or there is no incumbent, or the incumbent
could not be measured): times taken minutes apart never decide. Pure functions, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tiletune.client.wire import Config


def finalists(top: Sequence[Config], default: Config | None, incumbent: Config | None = None) -> list[Config]:
    """``top`` (best first), then the default, then the incumbent, each once."""
    unique: list[Config] = []
    for config in [*top, *(c for c in (default, incumbent) if c is not None)]:
        if config not in unique:
            unique.append(dict(config))
    return unique


@dataclass(frozen=True)
class Verdict:
    """What one interleaved validation run decided."""

    winner: Config
    winner_ms: float
    default_ms: float | None
    promote: bool


def judge(
    measured: Sequence[tuple[Config, float]], default: Config | None, incumbent: Config | None = None
) -> Verdict | None:
    """The run's fastest config and whether it replaces the incumbent; ``None`` when nothing ran."""
    if not measured:
        return None
    winner, winner_ms = min(measured, key=lambda pair: pair[1])
    default_ms = next((ms for config, ms in measured if config == default), None)
    if incumbent is None:
        promote = True
    elif incumbent == winner:
        promote = False
    else:
        incumbent_ms = next((ms for config, ms in measured if config == incumbent), math.inf)
        promote = winner_ms < incumbent_ms
    return Verdict(dict(winner), winner_ms, default_ms, promote)
