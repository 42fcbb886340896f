"""How a replica writes misses (reports and demand passes) without holding up the workers.

SQLite has one writer: a replica writes one report or demand pass at a time (:meth:`MissWriter.turn`),
in one thread of its own (:meth:`MissWriter.off_loop`: waiting reports hold none of the server's
threads), and leaves the database's writer free for :data:`WRITER_YIELD_S` between two of its
transactions (:meth:`MissWriter.write`), so a worker's heartbeat waits behind at most one bounded
transaction. On PostgreSQL (row locks) every turn is granted at once, the work runs in the
server's thread pool, and transactions follow each other without a pause.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TypeVar

from fastapi.concurrency import run_in_threadpool
from sqlalchemy.orm import Session

from tiletune.service.database import Database

#: Seconds a replica leaves SQLite's writer free between two of its misses transactions: longer
#: than the longest sleep of SQLite's busy handler (100 ms), so a writer waiting gets its turn.
WRITER_YIELD_S = 0.15

T = TypeVar("T")


class MissWriter:
    """Turns and transactions of this replica's misses writes; see the module docstring."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._serial = not db.postgres
        self._writing = threading.Lock()
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tiletune-misses")
        self._last_write_end_s = -math.inf

    async def off_loop(self, work: Callable[[], T]) -> T:
        """``work()`` (a report) in a thread: on SQLite this replica's one misses thread (reports
        wait for it holding none of the server's threads), on PostgreSQL the server's pool."""
        if self._serial:
            return await asyncio.wrap_future(self._thread.submit(work))
        return await run_in_threadpool(work)

    @contextmanager
    def turn(self, wait: bool = True) -> Iterator[bool]:
        """This replica's turn to write misses on SQLite (``True`` once it has it; ``False`` if it
        would have to wait and ``wait`` is False); always at once on PostgreSQL (row locks)."""
        if not self._serial:
            yield True
            return
        if not self._writing.acquire(blocking=wait):
            yield False
            return
        try:
            yield True
        finally:
            self._writing.release()

    @contextmanager
    def write(self) -> Iterator[Session]:
        """One write transaction of this replica's misses, on SQLite at least :data:`WRITER_YIELD_S`
        after the last one ended (callers hold :meth:`turn`)."""
        if self._serial:
            time.sleep(max(0.0, self._last_write_end_s + WRITER_YIELD_S - time.monotonic()))
        try:
            with self.db.write() as session:
                yield session
        finally:
            self._last_write_end_s = time.monotonic()
