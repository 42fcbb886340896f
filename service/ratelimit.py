"""Per-caller rate limits: a token bucket per key, in one replica's memory.

``allow(key)`` takes one token from ``key``'s bucket (``burst`` tokens, refilled at ``rate_per_s``)
and says whether there was one. Buckets of keys not seen for a while are dropped, so memory
stays bounded by the callers of the last minutes. Time comes from an injected clock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable

#: Buckets kept at most; beyond it the fullest (idle longest) are forgotten.
MAX_BUCKETS = 100_000


class RateLimiter:
    """Token buckets by key; ``rate_per_s`` 0 disables the limit."""

    def __init__(self, rate_per_s: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._clock = clock
        self._buckets: dict[Hashable, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def allow(self, key: Hashable) -> bool:
        """Take a token from ``key``'s bucket; False when it is empty."""
        if self.rate_per_s <= 0:
            return True
        now = self._clock()
        with self._lock:
            tokens, at = self._buckets.get(key, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - at) * self.rate_per_s)
            if len(self._buckets) >= MAX_BUCKETS and key not in self._buckets:
                self._buckets.clear()
            if tokens < 1.0:
                self._buckets[key] = (tokens, now)
                return False
            self._buckets[key] = (tokens - 1.0, now)
            return True

    def retry_after_s(self) -> float:
        """Seconds until an empty bucket holds one token again."""
        return 1.0 / self.rate_per_s if self.rate_per_s > 0 else 0.0
