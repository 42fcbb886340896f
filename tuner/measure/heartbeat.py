"""Keeping a lease alive: a daemon thread that renews it every ``heartbeat_s``.

One attempt per beat (the next beat is the retry). Imports the REST client and the wire
schemas only.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from tiletune.client.api import ServiceApi
from tiletune.client.calls import ApiError, LeaseLostError
from tiletune.client.wire import LeasePublic

logger = logging.getLogger(__name__)


class Heartbeat:
    """Renews one lease from a daemon thread every ``heartbeat_s`` until stopped or lost.

    A failed heartbeat (server away) is retried at the next beat; a 409
    ``lease_lost`` ends the thread. :meth:`check` raises :class:`LeaseLostError` once
    the server said so, or when no renewal succeeded for ``lease_s`` (the
    server has expired the lease by then).
    """

    def __init__(self, api: ServiceApi, lease: LeasePublic, clock: Callable[[], float]) -> None:
        self._api = api
        self._lease = lease
        self._clock = clock
        self._renewed_at = clock()
        self._lost: str | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"heartbeat-job-{lease.job.id}", daemon=True)

    def start(self) -> None:
        """Start beating."""
        self._thread.start()

    def stop(self) -> None:
        """Stop beating (waits briefly for a beat in flight; a late one is ignored)."""
        self._done.set()
        if self._thread.is_alive():
            self._thread.join(timeout=1.0)

    def check(self) -> None:
        """Raise :class:`LeaseLostError` when the lease is known or presumed lost."""
        if self._lost is not None:
            raise LeaseLostError(self._lost)
        silent_s = self._clock() - self._renewed_at
        if silent_s > self._lease.lease_s:
            raise LeaseLostError(
                f"no heartbeat got through for {silent_s:.0f} s (lease_s {self._lease.lease_s})"
            )

    def _loop(self) -> None:
        while not self._done.wait(self._lease.heartbeat_s):
            if not self._beat():
                return

    def _beat(self) -> bool:
        """One renewal; False once the lease is lost."""
        try:
            self._api.heartbeat(self._lease.token, attempts=1)
        except LeaseLostError as lost:
            self._lost = str(lost) or "the server ended the lease"
            return False
        except ApiError as error:
            if not self._done.is_set():
                logger.warning("job %d: heartbeat failed (%s)", self._lease.job.id, error)
            return True
        self._renewed_at = self._clock()
        return True
