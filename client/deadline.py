"""The deadline of one exchange with the server: when it must be over, in all.

A call takes at most its deadline from connecting to the last byte of its answer, not per
read. :class:`Deadline` says when that is; :meth:`Deadline.on_this_thread` makes it the
deadline of the calling thread's socket operations, which the sync twin's transport
(:class:`~tiletune.client.transport.DeadlineTransport`) cuts to the time left
(:func:`cut_to_deadline`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpcore
import httpx

from tiletune.client.calls import Call


@dataclass(frozen=True)
class Deadline:
    """When an exchange must be over (``time.monotonic()``), and the seconds it was given."""

    at: float
    seconds: float

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(time.monotonic() + seconds, seconds)

    def left_s(self) -> float:
        return self.at - time.monotonic()

    def passed(self) -> bool:
        return self.left_s() <= 0

    def check(self) -> None:
        """Raise ``httpx.ReadTimeout`` once the deadline has passed."""
        if self.passed():
            raise httpx.ReadTimeout(f"no complete answer within {self.seconds:g} s")

    def missed(self, url: str, call: Call[Any]) -> str:
        """The message of a call that ran out of time."""
        return f"no complete answer from {url}{call.path} within {self.seconds:g} s (its deadline)"

    @contextlib.contextmanager
    def on_this_thread(self) -> Iterator[None]:
        """Make this the deadline of the calling thread's socket operations
        (:class:`~tiletune.client.transport.DeadlineTransport`)."""
        before, _THREAD_DEADLINE.at = _THREAD_DEADLINE.at, self.at
        try:
            yield
        finally:
            _THREAD_DEADLINE.at = before


class _ThreadDeadline(threading.local):
    """The deadline (``time.monotonic()``) of the exchange a thread is making; ``None`` between."""

    at: float | None = None


_THREAD_DEADLINE = _ThreadDeadline()


def cut_to_deadline(timeout: float | None, expired: type[httpcore.TimeoutException]) -> float | None:
    """The timeout of one socket operation, cut to the time left before its thread's deadline;
    ``expired`` once it has passed."""
    at = _THREAD_DEADLINE.at
    if at is None:
        return timeout
    left = at - time.monotonic()
    if left <= 0:
        raise expired("the call's deadline passed")
    return left if timeout is None else min(timeout, left)
