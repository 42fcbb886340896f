"""What a search has measured: outcomes, the ranking, counts and the best-so-far history.

Contract: :class:`Record` holds one outcome per measured key (a time in ms, or
the error of a measured failure), the successful ones ranked fastest first
(ties in the order they were added), the counts by outcome (``invalid`` and
``duplicate`` proposals are counted here too, though they hold no outcome), the
best time after each measurement (``inf`` until one succeeds), the fastest
success of each *niche* (one knob at one of its values), and how many
measurements in a row did not improve the best by more than
``min_improvement`` (relative). Adding a key twice is the caller's error; the
record does not check it.

Imports the standard library and :mod:`tiletune.tuner.search.encoding` only.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from tiletune.tuner.search.encoding import Key


@dataclass(frozen=True)
class SearchCounts:
    """Trials by outcome: ``completed`` and ``failed`` are unique measurements."""

    completed: int = 0
    invalid: int = 0
    duplicate: int = 0
    failed: int = 0

    @property
    def measured(self) -> int:
        """Unique valid configs measured (successes and failures): what budgets count."""
        return self.completed + self.failed

    def as_dict(self) -> dict[str, int]:
        """The counts as a JSON-ready dict."""
        return {
            "completed": self.completed,
            "invalid": self.invalid,
            "duplicate": self.duplicate,
            "failed": self.failed,
        }


class Record:
    """The measurements of one search; see the module docstring for the contract."""

    def __init__(self, min_improvement: float) -> None:
        self.outcomes: dict[Key, float | str] = {}
        #: ``(time_ms, order, key)`` of every success, fastest first.
        self.ranked: list[tuple[float, int, Key]] = []
        #: The best time after each measurement.
        self.history: list[float] = []
        self.since_improvement = 0
        #: The fastest success per ``(knob index, value index)``: the best of each niche.
        self.niche_best: dict[tuple[int, int], tuple[float, int, Key]] = {}
        self._min_improvement = min_improvement
        self._counts = {"completed": 0, "invalid": 0, "duplicate": 0, "failed": 0}

    def __contains__(self, key: Key) -> bool:
        return key in self.outcomes

    @property
    def best_ms(self) -> float:
        """The fastest time measured (``inf`` before the first success)."""
        return self.ranked[0][0] if self.ranked else math.inf

    @property
    def measured(self) -> int:
        """Unique valid configs measured, failures included."""
        return self._counts["completed"] + self._counts["failed"]

    @property
    def counts(self) -> SearchCounts:
        """Trials by outcome."""
        return SearchCounts(**self._counts)

    def niche_bases(self) -> list[Key]:
        """The best key of each niche (a knob at one of its values), fastest first, no repeats."""
        return list(dict.fromkeys(key for _, _, key in sorted(self.niche_best.values())))

    def count(self, kind: str) -> None:
        """Count a proposal that holds no outcome: ``invalid`` or ``duplicate``."""
        self._counts[kind] += 1

    def add_time(self, key: Key, time_ms: float) -> None:
        """Record a successful measurement."""
        best = self.best_ms
        self.outcomes[key] = time_ms
        self._counts["completed"] += 1
        entry = (time_ms, len(self.outcomes), key)
        bisect.insort(self.ranked, entry)
        for niche in enumerate(key):
            if niche not in self.niche_best or entry < self.niche_best[niche]:
                self.niche_best[niche] = entry
        self._after_measurement(improved=time_ms < best * (1.0 - self._min_improvement))

    def add_failure(self, key: Key, error: str) -> None:
        """Record a measured failure (it never improves the best)."""
        self.outcomes[key] = error
        self._counts["failed"] += 1
        self._after_measurement(improved=False)

    def _after_measurement(self, improved: bool) -> None:
        self.history.append(self.best_ms)
        self.since_improvement = 0 if improved else self.since_improvement + 1
