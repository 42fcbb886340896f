"""Alembic migrations of the service's tables, on SQLite and PostgreSQL.

The contract (``tiletune.service.migrate``): upgrade from empty creates every
table of ``Base.metadata`` with the models' constraint names and our own
version table; the result has no drift; downgrade to base and back works;
upgrade at head changes nothing; tables that are not ours (Optuna's, with
its ``alembic_version``) are never reported, touched or dropped.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, event, inspect, text

from tests.service.conftest import postgres_database
from tiletune.service.database import make_engine
from tiletune.service.migrate import (
    VERSION_TABLE,
    alembic_config,
    current_revision,
    downgrade,
    drift,
    script_location,
    upgrade,
)
from tiletune.service.models import Base

OUR_TABLES = set(Base.metadata.tables)
FOREIGN_TABLES = {"studies", "alembic_version"}
OPTUNA_VERSION = "v3.2.0.a"
#: The newest revision.
HEAD = "0014"
WRITE_VERBS = ("CREATE", "ALTER", "DROP", "INSERT", "UPDATE", "DELETE")


def table_names(url: str) -> set[str]:
    """The tables in the database at ``url`` (default schema)."""
    engine = make_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def constraint_names(url: str) -> dict[str, set[str]]:
    """Per table of ours: the names of its primary key, foreign keys, unique constraints and indexes."""
    engine = make_engine(url)
    try:
        inspector = inspect(engine)
        names: dict[str, set[str]] = {}
        for table in OUR_TABLES:
            found = {inspector.get_pk_constraint(table)["name"]}
            found |= {fk["name"] for fk in inspector.get_foreign_keys(table)}
            found |= {uq["name"] for uq in inspector.get_unique_constraints(table)}
            found |= {ix["name"] for ix in inspector.get_indexes(table) if "duplicates_constraint" not in ix}
            names[table] = {name for name in found if name is not None}
        return names
    finally:
        engine.dispose()


def metadata_constraint_names() -> dict[str, set[str]]:
    """What :func:`constraint_names` must find: the names the models' naming convention gives."""
    names: dict[str, set[str]] = {}
    for table in Base.metadata.sorted_tables:
        found = {str(constraint.name) for constraint in table.constraints if constraint.name is not None}
        found |= {str(index.name) for index in table.indexes}
        names[table.name] = found
    return names


def add_foreign_tables(url: str) -> None:
    """Simulate Optuna sharing the database: a ``studies`` table and its ``alembic_version``, with rows."""
    statements = [
        "CREATE TABLE studies (study_id INTEGER PRIMARY KEY, study_name VARCHAR(512))",
        "INSERT INTO studies (study_id, study_name) VALUES (1, 'kept')",
        "CREATE TABLE alembic_version (version_num VARCHAR(32) PRIMARY KEY)",
        f"INSERT INTO alembic_version (version_num) VALUES ('{OPTUNA_VERSION}')",
    ]
    engine = make_engine(url)
    try:
        with engine.begin() as connection:
            for statement in statements:
                connection.execute(text(statement))
    finally:
        engine.dispose()


def foreign_rows(url: str) -> list[list[tuple[Any, ...]]]:
    """The rows of the simulated Optuna tables."""
    queries = ["SELECT study_id, study_name FROM studies", "SELECT version_num FROM alembic_version"]
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            return [[tuple(row) for row in connection.execute(text(query))] for query in queries]
    finally:
        engine.dispose()


@contextmanager
def recorded_statements() -> Iterator[list[str]]:
    """Every SQL statement any engine executes inside the block."""
    statements: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    event.listen(Engine, "before_cursor_execute", record)
    try:
        yield statements
    finally:
        event.remove(Engine, "before_cursor_execute", record)


def test_config_needs_no_ini_file_and_finds_the_installed_scripts() -> None:
    config = alembic_config("sqlite:///unused.db")
    assert config.config_file_name is None
    folder = script_location()
    assert (folder / "env.py").is_file()
    assert (folder / "script.py.mako").is_file()
    assert ScriptDirectory.from_config(config).get_heads() == [HEAD]


def test_upgrade_from_empty_creates_every_table_and_our_version_table(database_url: str) -> None:
    assert current_revision(database_url) is None
    upgrade(database_url)
    assert table_names(database_url) == OUR_TABLES | {VERSION_TABLE}
    assert current_revision(database_url) == HEAD


def test_upgrade_uses_the_models_constraint_names(database_url: str) -> None:
    upgrade(database_url)
    assert constraint_names(database_url) == metadata_constraint_names()


def test_no_drift_after_upgrade(database_url: str) -> None:
    upgrade(database_url)
    assert drift(database_url) == []


def test_drift_sees_a_schema_that_differs_from_the_models(database_url: str) -> None:
    upgrade(database_url)
    engine = make_engine(database_url)
    try:
        with engine.begin() as connection:
            connection.execute(text("DROP INDEX ix_jobs_sweep_id"))
            connection.execute(text("ALTER TABLE jobs ADD COLUMN stray INTEGER"))
    finally:
        engine.dispose()
    diffs = {diff[0]: diff for diff in drift(database_url)}
    assert set(diffs) == {"add_index", "remove_column"}
    assert diffs["add_index"][1].name == "ix_jobs_sweep_id"
    assert (diffs["remove_column"][2], diffs["remove_column"][3].name) == ("jobs", "stray")


def test_downgrade_to_base_removes_our_tables_and_upgrade_works_again(database_url: str) -> None:
    upgrade(database_url)
    downgrade(database_url, "base")
    assert table_names(database_url) == {VERSION_TABLE}
    assert current_revision(database_url) is None
    upgrade(database_url)
    assert table_names(database_url) == OUR_TABLES | {VERSION_TABLE}
    assert current_revision(database_url) == HEAD
    assert drift(database_url) == []


#: Tables that revisions after 0001 create (0002: misses, 0004: tokens, 0007: browser_sessions).
LATER_TABLES = {"misses", "tokens", "browser_sessions", "key_usage", "retune_plans", "retunes"}


def test_later_revisions_go_up_and_down_over_the_initial_schema(database_url: str) -> None:
    upgrade(database_url, "0001")
    assert table_names(database_url) == (OUR_TABLES - LATER_TABLES) | {VERSION_TABLE}
    upgrade(database_url)
    assert current_revision(database_url) == HEAD
    assert drift(database_url) == []
    downgrade(database_url, "0001")
    assert current_revision(database_url) == "0001"
    assert table_names(database_url) == (OUR_TABLES - LATER_TABLES) | {VERSION_TABLE}


def test_upgrade_at_head_is_a_read_only_no_op(database_url: str) -> None:
    upgrade(database_url)
    with recorded_statements() as statements:
        upgrade(database_url)
    assert statements, "the version table is read"
    assert not [s for s in statements if s.lstrip().upper().startswith(WRITE_VERBS)]
    assert current_revision(database_url) == HEAD
    assert table_names(database_url) == OUR_TABLES | {VERSION_TABLE}


def test_tables_that_are_not_ours_are_ignored_and_untouched(database_url: str) -> None:
    add_foreign_tables(database_url)
    before = foreign_rows(database_url)
    assert current_revision(database_url) is None

    upgrade(database_url)
    assert table_names(database_url) == OUR_TABLES | FOREIGN_TABLES | {VERSION_TABLE}
    assert current_revision(database_url) == HEAD
    assert drift(database_url) == []
    assert foreign_rows(database_url) == before

    downgrade(database_url, "base")
    assert table_names(database_url) == FOREIGN_TABLES | {VERSION_TABLE}
    assert foreign_rows(database_url) == before == [[(1, "kept")], [(OPTUNA_VERSION,)]]


def test_offline_mode_emits_the_schema_as_sql(database_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    command.upgrade(alembic_config(database_url), "head", sql=True)
    sql = capsys.readouterr().out
    assert f"CREATE TABLE {VERSION_TABLE}" in sql
    assert "CREATE TABLE alembic_version" not in sql
    for table in OUR_TABLES:
        assert f"CREATE TABLE {table} " in sql
    assert "INSERT INTO tiletune_alembic_version (version_num) VALUES ('0001')" in sql
    assert f"UPDATE tiletune_alembic_version SET version_num='{HEAD}'" in sql
    assert table_names(database_url) == set(), "offline mode never touches the database"


def test_concurrent_upgrades_on_postgresql_serialize() -> None:
    """Server replicas starting at once (separate processes: Alembic's context is process-global)."""
    program = "import sys; from tiletune.service.migrate import upgrade; upgrade(sys.argv[1])"
    with postgres_database() as url:
        processes = [
            subprocess.Popen([sys.executable, "-c", program, url], stderr=subprocess.PIPE, text=True)
            for _ in range(3)
        ]
        outcomes = [(process.wait(timeout=120), process.communicate()[1]) for process in processes]
        assert outcomes == [(0, "")] * 3
        assert current_revision(url) == HEAD
        assert drift(url) == []
