"""Database URLs and engines: SQLite (embedded default) and PostgreSQL (scale-out).

Engines are made by :func:`make_engine`, never at import time. SQLite gets
WAL journaling, a busy timeout and enforced foreign keys on every connection,
and, on an engine for writes (``write_lock=True``), every transaction starts
with ``BEGIN IMMEDIATE`` (it takes the write lock at once, waiting up to the
busy timeout, instead of failing with "database is locked" when a reader
later tries to write); a read engine's transactions take no lock (WAL readers
never wait). So a server, its threads and a test can use one file at once.
PostgreSQL URLs are taken as given (``postgresql://`` is read as psycopg 3).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

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
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _begin_immediate(connection: Any) -> None:
    connection.exec_driver_sql("BEGIN IMMEDIATE")


def make_sessions(engine: Engine) -> sessionmaker[Session]:
    """A session factory whose objects stay readable after commit."""
    return sessionmaker(engine, expire_on_commit=False)
