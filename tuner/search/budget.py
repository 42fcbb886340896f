"""When a search stops: its budgets of measurements, time and patience.

Contract: :class:`Budget` is built from the optional limits of a search
(``ValueError`` naming the first limit that is given and not positive) and
starts its clock when built. ``stop_reason`` names the first spent budget,
in the order ``max_trials``, ``max_time``, ``patience``, ``exhausted``, or
returns ``None``; ``room`` bounds how many more candidates may be in flight.
Time comes only from the injected ``clock``.

Imports the standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Callable


class Budget:
    """The limits of one search; see the module docstring for the contract."""

    def __init__(
        self,
        max_trials: int | None,
        max_time_s: float | None,
        patience: int | None,
        clock: Callable[[], float],
    ) -> None:
        for name, value in (("max_trials", max_trials), ("max_time_s", max_time_s), ("patience", patience)):
            if value is not None and not value > 0:
                raise ValueError(f"{name}: must be positive when given, got {value!r}")
        self.max_trials = max_trials
        self._max_time_s = max_time_s
        self._patience = patience
        self._clock = clock
        self._started_s = clock()

    def stop_reason(self, measured: int, since_improvement: int, exhausted: bool) -> str | None:
        """The spent budget, given the measurements so far, or ``None`` while the search runs."""
        if self.max_trials is not None and measured >= self.max_trials:
            return "max_trials"
        if self._max_time_s is not None and self._clock() - self._started_s >= self._max_time_s:
            return "max_time"
        if self._patience is not None and since_improvement >= self._patience:
            return "patience"
        if exhausted:
            return "exhausted"
        return None

    def room(self, in_flight: int, valid_count: int | None) -> int:
        """How many more candidates may be outstanding, with ``in_flight`` measured or outstanding."""
        room = math.inf if self.max_trials is None else self.max_trials - in_flight
        if valid_count is not None:
            room = min(room, valid_count - in_flight)
        return int(max(0, min(room, 1 << 30)))
