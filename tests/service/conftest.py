"""Databases for the service's contract suites: every test runs on SQLite and on PostgreSQL.

PostgreSQL is the server at ``$TILETUNE_TEST_POSTGRES`` (default
``postgresql://postgres@127.0.0.1:5432/test``, trust auth, as on CI). Each
test gets a fresh database of its own (created from the admin database and
dropped afterwards), so tests and parallel runs never see each other's rows.
PostgreSQL being unreachable is an error, not a skip: CI must run these.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, select, text
from sqlalchemy.engine import make_url

from tiletune.service.database import normalize_url
from tiletune.service.models import Base

# The server_contract marker (`make test-lowest`): its hooks, registered by this conftest.
from .server_contract import pytest_collection_modifyitems, pytest_ignore_collect  # noqa: F401

POSTGRES_ADMIN_URL = os.environ.get("TILETUNE_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")

DATABASES = ("sqlite", "postgresql")


class ManualClock:
    """A clock the test moves by hand (the store's injected clock: expiry without sleeping)."""

    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(params=DATABASES)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of an empty database: a fresh SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'tiletune.db'}"
        return
    with postgres_database() as url:
        yield url


class postgres_database:  # noqa: N801 (used as a context manager, like a function)
    """A throwaway PostgreSQL database: created on enter, dropped (with its connections) on exit."""

    def __init__(self) -> None:
        self.name = f"tiletune_test_{uuid.uuid4().hex[:12]}"
        self._admin = create_engine(normalize_url(POSTGRES_ADMIN_URL), isolation_level="AUTOCOMMIT")

    def __enter__(self) -> str:
        with self._admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{self.name}"'))
        url = make_url(normalize_url(POSTGRES_ADMIN_URL)).set(database=self.name)
        return url.render_as_string(hide_password=False)

    def __exit__(self, *_exc: object) -> None:
        with self._admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)'))
        self._admin.dispose()


def snapshot(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table of ours."""
    engine = create_engine(normalize_url(url))
    try:
        with engine.connect() as connection:
            return {
                table.name: sorted(map(tuple, connection.execute(select(table))), key=repr)
                for table in Base.metadata.sorted_tables
            }
    finally:
        engine.dispose()
