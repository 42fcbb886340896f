"""Alembic environment of the service's tables; run by Alembic, never imported.

Contract:

- the database URL is the Config's ``sqlalchemy.url`` main option (a developer
  may override it with ``-x url=...``), normalized by
  :func:`tiletune.service.database.normalize_url` (``postgresql://`` means
  psycopg 3); online mode connects through
  :func:`tiletune.service.database.make_engine`, without pooling;
- versions are kept in ``tiletune_alembic_version``, never ``alembic_version``;
- autogenerate compares against ``tiletune.service.models.Base.metadata``
  with ``compare_type=True``, sees only the tables of that metadata (Optuna's
  or anyone else's are neither created nor dropped), and renders SQLite
  changes in batch mode (``render_as_batch``), as SQLite cannot alter tables;
- on PostgreSQL an online run holds a transaction-level advisory lock while
  it reads the version and migrates, so server replicas starting at once
  migrate one after another (the later ones find the schema at head).
"""

from __future__ import annotations

from logging.config import fileConfig
from typing import Any

from alembic import context
from sqlalchemy import pool, text

from tiletune.service.database import is_sqlite, make_engine, normalize_url
from tiletune.service.migrate import MIGRATION_LOCK_KEY, VERSION_TABLE, include_name
from tiletune.service.models import Base

config = context.config
target_metadata = Base.metadata

if config.config_file_name is not None:
    fileConfig(config.config_file_name, disable_existing_loggers=False)


def database_url() -> str:
    """The URL to migrate: ``-x url=...`` if given, else the ``sqlalchemy.url`` option."""
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("the Alembic config has no sqlalchemy.url")
    return normalize_url(url)


def configure_options(url: str) -> dict[str, Any]:
    """``context.configure`` options shared by online and offline runs."""
    return {
        "target_metadata": target_metadata,
        "version_table": VERSION_TABLE,
        "render_as_batch": is_sqlite(url),
        "compare_type": True,
        "include_name": include_name,
    }


def run_migrations_offline() -> None:
    """Emit the migrations as SQL for the URL's dialect, without connecting."""
    url = database_url()
    context.configure(
        url=url, literal_binds=True, dialect_opts={"paramstyle": "named"}, **configure_options(url)
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Migrate the database at the URL in one connection (one transaction where DDL is transactional)."""
    url = database_url()
    engine = make_engine(url, poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            context.configure(connection=connection, **configure_options(url))
            with context.begin_transaction():
                if connection.dialect.name == "postgresql":
                    connection.execute(
                        text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY}
                    )
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
