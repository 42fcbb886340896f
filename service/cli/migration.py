"""The ``migrate`` command: the database's schema brought to this release's, apart from serving.

- ``tiletune migrate [--db URL] [--json]``: upgrade to head (:func:`tiletune.service.migrate.upgrade`:
  under the migrations' advisory lock on PostgreSQL, so replicas and this command never migrate at
  once; a read and nothing else when already there); prints the revision before and after.
- ``tiletune migrate --check``: changes nothing; exit status 0 when the schema is at head, 1 when it
  is not (never migrated, older, or of another release).
- ``tiletune server --no-migrate`` (:func:`add_no_migrate_option`, :func:`prepare_schema`): checks
  instead of migrating (:func:`require_schema_at_head`) and refuses to start when the schema is not
  at head, naming ``tiletune migrate``; so the server's database role needs no right to change the
  schema, only to read and write rows.

The database URL: ``--db``, else ``$TILETUNE_DB_URL``, else the SQLite default, as for ``server``.
Exit statuses: 2 for a URL that is not one (field ``db``), 1 for a database that cannot be reached
or migrated. The URL is printed with its password hidden. Alembic and SQLAlchemy are imported when
the command runs (the ``[server]`` extra), never when the parser is built. :func:`migrate` and
:func:`safe_url` serve ``tiletune server`` and ``tiletune up`` too. Imported by
:mod:`~tiletune.service.cli.serve`, it takes that module's ``settings_of`` only inside a function.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from tiletune.service.cli.options import (
    EXIT_FAILURE,
    BadInputError,
    CommandFailedError,
    Commands,
    add_json_option,
    emit,
)

if TYPE_CHECKING:
    from tiletune.service.migrate import Revisions


def cmd_migrate(args: argparse.Namespace) -> int:
    """Upgrade the database to head (or, with ``--check``, say whether it is there); the exit status."""
    from tiletune.service.cli.serve import settings_of
    from tiletune.service.migrate import revisions, upgrade

    url = settings_of(args.db).db_url
    with _database_errors(url):
        before = revisions(url)
        if args.check:
            after = before
        else:
            if not before.at_head:
                upgrade(url)
            after = revisions(url)
    document = {
        "database": safe_url(url),
        "from_revision": before.current,
        "to_revision": after.current,
        "head": after.head,
        "at_head": after.at_head,
        "changed": after.current != before.current,
    }
    emit(args, document, _summary(before, after, args.check))
    return 0 if after.at_head else EXIT_FAILURE


def migrate(url: str) -> None:
    """Bring the database to the newest schema; a bad URL is bad input, an unreachable one a failure."""
    from tiletune.service.migrate import upgrade

    with _database_errors(url):
        upgrade(url)


def safe_url(url: str) -> str:
    """``url`` with its password hidden."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


def prepare_schema(url: str, no_migrate: bool) -> None:
    """What ``tiletune server`` does before serving: migrate to head, or with ``--no-migrate`` only
    check that the schema is there (:func:`require_schema_at_head`)."""
    if no_migrate:
        require_schema_at_head(url)
    else:
        migrate(url)


def require_schema_at_head(url: str) -> None:
    """Return when the database's schema is this release's; else :class:`CommandFailedError` naming
    ``tiletune migrate``. Reads the version table only (no DDL)."""
    from tiletune.service.migrate import revisions

    with _database_errors(url):
        found = revisions(url)
    if not found.at_head:
        raise CommandFailedError(
            f"--no-migrate: the database {safe_url(url)} is at revision {_named(found.current)}, this "
            f"release needs {found.head}; run `tiletune migrate --db URL` (as a role that may change "
            "the schema), then start the server again"
        )


def _summary(before: Revisions, after: Revisions, check: bool) -> str:
    """The text output: where the schema was and is."""
    if check:
        verdict = "at head" if after.at_head else f"not at head {after.head}: run `tiletune migrate`"
        return f"database at revision {_named(after.current)}: {verdict}"
    if after.current == before.current:
        return f"database already at head {after.head}: nothing to do"
    return f"database migrated from revision {_named(before.current)} to {_named(after.current)}"


def _named(revision: str | None) -> str:
    return revision if revision is not None else "none (never migrated)"


@contextmanager
def _database_errors(url: str) -> Iterator[None]:
    """A bad URL as bad input (field ``db``); a database that cannot be reached or migrated, or a
    revision these scripts do not know, as a failure naming the database (password hidden)."""
    from alembic.util.exc import CommandError
    from sqlalchemy.exc import ArgumentError, SQLAlchemyError

    try:
        yield
    except ArgumentError as error:
        raise BadInputError("db", f"not a usable database URL {safe_url(url)!r}: {error}") from None
    except (SQLAlchemyError, CommandError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise CommandFailedError(f"cannot migrate the database {safe_url(url)}: {reason}") from None


def add_no_migrate_option(server: argparse.ArgumentParser) -> None:
    """``tiletune server``'s ``--no-migrate``."""
    server.add_argument(
        "--no-migrate",
        action="store_true",
        help="change no schema: refuse to start unless `tiletune migrate` brought the database to this "
        "release's schema (the server's role then needs no DDL rights)",
    )


def add_migrate_parser(commands: Commands) -> None:
    """The ``migrate`` subcommand."""
    migrate = commands.add_parser(
        "migrate",
        help="bring the database's schema to this release's (apart from serving)",
        description="Upgrade the database to this release's schema (its newest revision), holding the "
        "migrations' lock on PostgreSQL; prints the revision before and after. Run it as a role that "
        "may change the schema, then run servers with `tiletune server --no-migrate` under a role that "
        "may only read and write rows. --check changes nothing: exit status 0 when the schema is at "
        "head, 1 when it is not.",
    )
    migrate.add_argument("--db", help="database URL (default: $TILETUNE_DB_URL, else sqlite:///tiletune.db)")
    migrate.add_argument(
        "--check",
        action="store_true",
        help="change nothing; exit 1 when the database is not at this release's head",
    )
    add_json_option(migrate)
    migrate.set_defaults(handler=cmd_migrate, extra="server")
