"""The store's clock: every time a replica writes or compares is the database's.

Replicas of one PostgreSQL store run on hosts whose clocks disagree. A lease written by one
replica (its expiry: that replica's now plus the lease time) and reaped by another (expired
when before *its* now) would otherwise be judged by two clocks: a replica 120 s ahead expires
every lease the moment it looks. So the times a replica writes and compares (lease expiry,
heartbeats, sessions, the demand budget's hour) come from :class:`StoreClock`: this host's clock
plus its measured offset to the database's (``clock_timestamp()``), with no query per call.

- The offset is measured at start and again every :data:`CHECK_S` (:meth:`StoreClock.check`, from
  the reaper's loop): of :data:`SAMPLES` round trips, the fastest, its database time against the
  midpoint of its two local readings; the error is at most half that round trip.
- ``skew_s`` (seconds the store is ahead of this replica; negative: behind) is exported as the
  gauge ``tiletune_clock_skew_seconds``; past :data:`WARN_SKEW_S` either way a warning says so
  (once, and once more when it is back within).
- SQLite is a file on one host: its clock is the host's, the offset 0, and nothing is queried.
- A measurement that fails (the database away) keeps the last offset and is tried again at the
  next check.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy import Engine, text
from sqlalchemy.exc import SQLAlchemyError

from tiletune.service.database import Clock, aware, utc_now

log = logging.getLogger(__name__)

#: Seconds between two measurements of the offset.
CHECK_S = 30.0
#: Round trips per measurement; the fastest counts.
SAMPLES = 3
#: A skew beyond this many seconds is logged as a warning.
WARN_SKEW_S = 1.0


class StoreClock:
    """``local() + offset``: the database's time read through this host's clock (see the module).

    ``engine`` is the store's (``None``, or SQLite: the host's clock is the store's). ``monotonic``
    paces :meth:`check`.
    """

    def __init__(
        self,
        engine: Engine | None,
        local: Clock = utc_now,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._engine = engine if engine is not None and engine.dialect.name == "postgresql" else None
        self._local = local
        self._monotonic = monotonic
        self._offset = timedelta(0)
        self._checked_at: float | None = None
        self._warned = False
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        return self._local() + self._offset

    @property
    def skew_s(self) -> float:
        """Seconds the store's clock is ahead of this host's (negative: behind), as last measured."""
        return self._offset.total_seconds()

    def check(self) -> None:
        """Measure the offset again when :data:`CHECK_S` has passed since the last measurement."""
        now = self._monotonic()
        with self._lock:
            if self._checked_at is not None and now - self._checked_at < CHECK_S:
                return
            self._checked_at = now
        self.measure()

    def measure(self) -> None:
        """Measure the offset now (nothing on SQLite); a failure keeps the last one, logged."""
        if self._engine is None:
            return
        try:
            offset = self._fastest_offset(self._engine)
        except SQLAlchemyError as error:
            log.warning("measuring this replica's clock against the database's failed (%s); kept", error)
            return
        self._offset = offset
        self._say_skew()

    def _fastest_offset(self, engine: Engine) -> timedelta:
        best: tuple[timedelta, timedelta] | None = None
        with engine.connect() as connection:
            for _ in range(SAMPLES):
                before = self._local()
                store = aware(connection.execute(text("SELECT clock_timestamp()")).scalar_one())
                after = self._local()
                trip = after - before
                if best is None or trip < best[0]:
                    best = (trip, store - (before + trip / 2))
            connection.rollback()
        assert best is not None
        return best[1]

    def _say_skew(self) -> None:
        skew = self.skew_s
        if abs(skew) > WARN_SKEW_S and not self._warned:
            self._warned = True
            side = "behind" if skew > 0 else "ahead of"
            log.warning(
                "this replica's clock is %.1f s %s the database's: the times it writes and compares "
                "are the database's; keep the hosts' clocks synchronised (NTP)",
                abs(skew),
                side,
            )
        elif abs(skew) <= WARN_SKEW_S and self._warned:
            self._warned = False
            log.info("this replica's clock is within %.1f s of the database's again", WARN_SKEW_S)
