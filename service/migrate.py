"""Schema migrations of the service's tables, run in code (no ini file needed).

Contract:

- :func:`upgrade` brings a database to a revision (default: head). It is
  idempotent, and when the database is already at head it only reads the
  version table (no DDL, no transaction of its own), so ``tiletune server``
  calls it at every start. On PostgreSQL concurrent upgrades are serialized
  by an advisory lock (see ``tiletune.migrations.env``).
- :func:`downgrade` goes back to a revision; ``"base"`` drops every table of
  ours and leaves the (empty) version table.
- :func:`current_revision` is the database's revision, ``None`` when it has
  never been migrated (or was downgraded to base); :func:`head_revision` the
  installed scripts' newest; :func:`revisions` both, read without any DDL (what
  ``tiletune migrate --check`` and ``tiletune server --no-migrate`` compare).
- :func:`drift` lists the differences between the database and
  ``Base.metadata`` as Alembic's autogenerate sees them (types compared);
  empty means the schema is what the models expect.
- Versions live in :data:`VERSION_TABLE`, not ``alembic_version``: Optuna
  also uses Alembic. Only tables of ``Base.metadata`` are compared or
  migrated (:func:`include_name`); other tables in the same database are
  never reported, created or dropped.
- The scripts come from the installed package ``tiletune.migrations`` (an
  editable install's link tree or a wheel); a new revision file is seen by an
  editable install after ``make relink``.

Every call makes its own engine (no pooling) and disposes of it. Calls that
run Alembic commands are not thread-safe within one process (Alembic's
environment context is process-global); across processes they are.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.environment import NameFilterParentNames, NameFilterType
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, pool

from tiletune.service.database import make_engine, normalize_url
from tiletune.service.models import Base

#: The service's Alembic version table (Optuna's is ``alembic_version``).
VERSION_TABLE = "tiletune_alembic_version"

#: PostgreSQL advisory lock key held while migrating ("tiletune" in ASCII).
MIGRATION_LOCK_KEY = 0x74696C6574756E65

MIGRATIONS_PACKAGE = "tiletune.migrations"


def script_location() -> Path:
    """The folder of the installed ``tiletune.migrations`` package (``env.py``, ``versions/``)."""
    location = resources.files(MIGRATIONS_PACKAGE)
    if not isinstance(location, Path):
        raise RuntimeError(f"{MIGRATIONS_PACKAGE} is not installed as a folder: {location!r}")
    return location


def alembic_config(url: str | None = None) -> Config:
    """An Alembic config for the database at ``url`` (none: the scripts alone), built in code from the
    installed scripts."""
    config = Config()
    # Config options are interpolated by configparser: a literal % is written %%.
    config.set_main_option("script_location", str(script_location()).replace("%", "%%"))
    config.set_main_option("path_separator", "os")
    if url is not None:
        config.set_main_option("sqlalchemy.url", normalize_url(url).replace("%", "%%"))
    return config


@dataclass(frozen=True)
class Revisions:
    """Where a database's schema is (``current``: ``None`` when never migrated) and where this
    release's scripts end (``head``)."""

    current: str | None
    head: str

    @property
    def at_head(self) -> bool:
        """True when the schema is the one this release's models expect."""
        return self.current == self.head


def include_name(name: str | None, type_: NameFilterType, parent_names: NameFilterParentNames) -> bool:
    """Alembic name filter: of the database's tables, only those of ``Base.metadata`` are seen."""
    return type_ != "table" or name in Base.metadata.tables


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate the database at ``url`` up to ``revision``; a no-op (one read) when already there."""
    config = alembic_config(url)
    if revision == "head" and _current_heads(url) == set(ScriptDirectory.from_config(config).get_heads()):
        return
    command.upgrade(config, revision)


def downgrade(url: str, revision: str) -> None:
    """Migrate the database at ``url`` down to ``revision`` (``"base"``: drop every table of ours)."""
    command.downgrade(alembic_config(url), revision)


def current_revision(url: str) -> str | None:
    """The revision of the database at ``url``; ``None`` when it is not under migration (yet)."""
    heads = _current_heads(url)
    if len(heads) > 1:
        raise RuntimeError(f"the database has several heads: {sorted(heads)}")
    return next(iter(heads), None)


def head_revision() -> str:
    """The newest revision of the installed scripts."""
    heads = ScriptDirectory.from_config(alembic_config()).get_heads()
    if len(heads) != 1:
        raise RuntimeError(f"the migration scripts have {len(heads)} heads: {sorted(heads)}")
    return heads[0]


def revisions(url: str) -> Revisions:
    """The database's revision and the scripts' head; reads the version table only."""
    return Revisions(current_revision(url), head_revision())


def drift(url: str) -> list[Any]:
    """Differences between the database at ``url`` and ``Base.metadata`` (Alembic's diff tuples).

    Empty when the schema matches the models. Tables outside ``Base.metadata``
    (the version table, Optuna's) are ignored.
    """
    with _connection(url) as connection:
        context = MigrationContext.configure(
            connection,
            opts={"compare_type": True, "include_name": include_name, "version_table": VERSION_TABLE},
        )
        return list(compare_metadata(context, Base.metadata))


def _current_heads(url: str) -> set[str]:
    with _connection(url) as connection:
        context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
        return set(context.get_current_heads())


@contextmanager
def _connection(url: str) -> Iterator[Connection]:
    engine = make_engine(url, poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            yield connection
    finally:
        engine.dispose()
