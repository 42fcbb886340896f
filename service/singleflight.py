"""One run of a blocking computation per key at a time, shared by every request that awaits it.

:class:`SingleFlight` runs ``compute`` in the thread pool (never on the event loop) the first
time a key is awaited; requests that await the same key while it runs wait for that run and
get its result (or its exception), so a thousand requests arriving at once cost one run. The
key is forgotten when the run ends: a later await runs again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from starlette.concurrency import run_in_threadpool

T = TypeVar("T")


class SingleFlight(Generic[T]):
    """Concurrent awaiters of one key share one run; see the module docstring.

    ``runs`` counts the runs started (what a test of "built once" reads).
    """

    def __init__(self) -> None:
        self._running: dict[Hashable, tuple[asyncio.AbstractEventLoop, asyncio.Future[T]]] = {}
        self.runs = 0

    async def run(self, key: Hashable, compute: Callable[[], T]) -> T:
        """The result of the run of ``key`` under way, else of a new run of ``compute``."""
        loop = asyncio.get_running_loop()
        found = self._running.get(key)
        if found is None or found[0] is not loop:  # a future of another loop cannot be awaited here
            future: asyncio.Future[T] = asyncio.ensure_future(run_in_threadpool(compute))
            self.runs += 1
            self._running[key] = (loop, future)
            future.add_done_callback(lambda done: self._forget(key, done))
        else:
            future = found[1]
        return await asyncio.shield(future)  # one caller going away does not cancel the others' run

    def _forget(self, key: Hashable, done: asyncio.Future[T]) -> None:
        found = self._running.get(key)
        if found is not None and found[1] is done:
            del self._running[key]
        if not done.cancelled():
            done.exception()  # retrieved: an error nobody awaited any more is not logged as lost
