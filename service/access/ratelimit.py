"""Per-caller rate limits: a token bucket per key, in one replica's memory.

``allow(key)`` takes one token from ``key``'s bucket (``burst`` tokens, refilled at ``rate_per_s``)
and says whether there was one; ``refund(key)`` gives one back (a limit on failures: take one
before the attempt, so that concurrent attempts cannot pass together, and give it back when the
attempt did not fail). At most :data:`MAX_BUCKETS` buckets are kept (beyond, all are
forgotten), so memory stays bounded. Time comes from an injected clock. :func:`address_key` is
the key of a client's address (an IPv6 client's /64 network: one host holds all of it).
"""

from __future__ import annotations

import ipaddress
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

    def refund(self, key: Hashable) -> None:
        """Give back a token taken from ``key``'s bucket (never above ``burst``)."""
        if self.rate_per_s <= 0:
            return
        with self._lock:
            found = self._buckets.get(key)
            if found is not None:
                self._buckets[key] = (min(float(self.burst), found[0] + 1.0), found[1])

    def retry_after_s(self) -> float:
        """Seconds until an empty bucket holds one token again."""
        return 1.0 / self.rate_per_s if self.rate_per_s > 0 else 0.0


def address_key(host: str) -> str:
    """The rate-limit key of a client address: the address, or an IPv6 address's /64 network."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)
