"""Database URLs and engines: SQLite (embedded default) and PostgreSQL (scale-out).

Engines are made by :func:`make_engine`, never at import time. SQLite gets
WAL journaling with ``synchronous=NORMAL`` (a commit survives the process being killed at any
point; only a power loss or OS crash may take back the last commits, never corrupting the
file: WAL's own guarantee), a busy timeout and enforced foreign keys on every connection,
and, on an engine for writes (``write_lock=True``), every transaction starts
with ``BEGIN IMMEDIATE`` (it takes the write lock at once, waiting up to the
busy timeout, instead of failing with "database is locked" when a reader
later tries to write); a read engine's transactions take no lock (WAL readers
never wait). So a server, its threads and a test can use one file at once.
PostgreSQL URLs are taken as given (``postgresql://`` is read as psycopg 3).

:class:`Database` is what the service's operations hold: a write and a read session factory,
the injected clock, and the generation of the best configs. The rule for transactions: the
repositories (:mod:`~tiletune.service.fleet`, :mod:`~tiletune.service.scheduling.jobs`,
:mod:`~tiletune.service.configs`, :mod:`~tiletune.service.scheduling.queue`,
:mod:`~tiletune.service.views`) take a session and never commit; only the operations (the
routes, :mod:`~tiletune.service.scheduling.protocol`, :mod:`~tiletune.service.demand.misses`,
:mod:`~tiletune.service.lookup`) open one, with :meth:`Database.write` or :meth:`Database.read`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]

#: ``session.info`` key set by a change of best configs (a promotion or an import).
CONFIGS_CHANGED = "tiletune.configs_changed"

#: Where ``tiletune server`` keeps its data when no ``--db`` is given.
DEFAULT_SQLITE_PATH = Path("tiletune.db")

SQLITE_BUSY_TIMEOUT_MS = 30_000


def default_url(path: Path = DEFAULT_SQLITE_PATH) -> str:
    """The SQLite URL of a database file."""
    return f"sqlite:///{path}"


def normalize_url(url: str) -> str:
    """``url`` with ``postgresql://`` / ``postgres://`` mapped to the psycopg 3 driver."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def is_sqlite(url: str) -> bool:
    """True for SQLite URLs."""
    return make_url(normalize_url(url)).get_backend_name() == "sqlite"


def make_engine(url: str, write_lock: bool = True, **kwargs: Any) -> Engine:
    """An engine for ``url``; SQLite connections get WAL, a busy timeout and foreign keys."""
    url = normalize_url(url)
    if not is_sqlite(url):
        return create_engine(url, pool_pre_ping=True, **kwargs)
    database = make_url(url).database
    if database and database != ":memory:":
        Path(database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"check_same_thread": False}, **kwargs)
    event.listen(engine, "connect", _configure_sqlite)
    if write_lock:
        event.listen(engine, "begin", _begin_immediate)
    return engine


def _configure_sqlite(connection: Any, _record: Any) -> None:
    connection.isolation_level = None  # the driver's own BEGIN is off: _begin_immediate issues it
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _begin_immediate(connection: Any) -> None:
    connection.exec_driver_sql("BEGIN IMMEDIATE")


def make_sessions(engine: Engine) -> sessionmaker[Session]:
    """A session factory whose objects stay readable after commit."""
    return sessionmaker(engine, expire_on_commit=False)


def utc_now() -> datetime:
    """The wall clock, timezone-aware UTC."""
    return datetime.now(UTC)


def aware(moment: datetime) -> datetime:
    """``moment`` as timezone-aware UTC (SQLite hands back naive datetimes)."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


class Database:
    """Sessions for writes and reads, the clock, and the best configs' generation.

    ``generation`` moves after every committed transaction that changed a best config (a
    repository marks it with :func:`configs_changed`), never before the commit: a cache
    that stored an answer under the old generation drops it, and one that read the new
    generation reads committed rows. Then each of ``after_configs_change`` is called, in the
    writer's thread, before :meth:`write` returns (the index of best configs applies the change
    there, so the write's answer is sent after its change is served); one that raises is logged.
    """

    def __init__(
        self,
        sessions: sessionmaker[Session],
        clock: Clock = utc_now,
        reads: sessionmaker[Session] | None = None,
    ) -> None:
        self.sessions = sessions
        self.reads = reads or sessions
        self.clock = clock
        self.generation = 0
        self.after_configs_change: list[Callable[[], object]] = []

    @property
    def postgres(self) -> bool:
        """True on PostgreSQL (row locks, ``SKIP LOCKED``)."""
        bind = self.sessions.kw.get("bind")
        return bind is not None and bind.dialect.name == "postgresql"

    @contextmanager
    def write(self) -> Iterator[Session]:
        """One write transaction: committed when the block ends, rolled back if it raises."""
        with self.sessions.begin() as session:
            yield session
        if session.info.pop(CONFIGS_CHANGED, False):
            self.generation += 1
            for call in self.after_configs_change:
                try:
                    call()
                except Exception:
                    log.exception("applying a change of best configs after its commit failed")

    @contextmanager
    def read(self) -> Iterator[Session]:
        """A read-only session (on SQLite, of the read engine: it never waits for the writer)."""
        with self.reads() as session:
            yield session


#: SQLite's result code for a full disk (``SQLITE_FULL``), and PostgreSQL's SQLSTATE (``disk_full``).
SQLITE_FULL = 13
POSTGRES_DISK_FULL = "53100"


def disk_full(error: BaseException) -> bool:
    """True when a database error, or one it was raised during, says the disk is full (SQLite's
    ``SQLITE_FULL``, which ``max_page_count`` raises too; PostgreSQL's ``53100``). SQLite rolls a
    full transaction back itself, so the error raised may be a savepoint's that no longer exists,
    during the full disk's."""
    seen: BaseException | None = error
    for _ in range(8):  # a chain is short; a loop in one never hangs
        if seen is None:
            return False
        cause = getattr(seen, "orig", None)
        if getattr(cause, "sqlite_errorcode", None) == SQLITE_FULL:
            return True
        if getattr(cause, "sqlstate", None) == POSTGRES_DISK_FULL:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def configs_changed(session: Session) -> None:
    """Mark ``session``'s transaction as one that changes best configs (see :class:`Database`)."""
    session.info[CONFIGS_CHANGED] = True
