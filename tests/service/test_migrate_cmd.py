"""``tiletune migrate`` and ``tiletune server --no-migrate``: the schema changed apart from serving.

On PostgreSQL: ``migrate --check`` says an empty database is not at head and changes nothing;
``server --no-migrate`` refuses it naming ``tiletune migrate``; ``migrate`` brings it to head;
then a role that may read and write rows but not change the schema runs ``server --no-migrate``
and serves lookups, a registration, a sweep and a lease. On SQLite (in-process): the JSON
documents, the exit statuses, and bad or unreachable URLs.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ProgrammingError

from tests.credentials import ADMIN
from tests.service.conftest import POSTGRES_ADMIN_URL, postgres_database
from tests.service.processes import (
    FAST_LEASES,
    SERVER_TILETUNE,
    START_TIMEOUT_S,
    free_port,
    run_cli,
    spawn,
    stop,
    wait_for_health,
)
from tiletune.service.cli.main import main
from tiletune.service.database import normalize_url
from tiletune.service.migrate import VERSION_TABLE, head_revision

CHIP: dict[str, Any] = {"name": "cpu/Migrate Test Chip/2c", "kind": "cpu", "local_memory_bytes": 1 << 20}


def migrate_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, object]]:
    """``tiletune migrate ARGS --json`` (in this process): its exit status and document."""
    status = main(["migrate", *args, "--json"])
    document: dict[str, object] = json.loads(capsys.readouterr().out)
    return status, document


def grant_rows_only(url: str, role: str) -> str:
    """A login ``role`` that may read and write every table and sequence of ``url``'s database and
    create nothing; the URL that connects as it."""
    engine = create_engine(normalize_url(url), isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            connection.execute(text(f'CREATE ROLE "{role}" LOGIN'))
            connection.execute(text("REVOKE CREATE ON SCHEMA public FROM PUBLIC"))
            connection.execute(
                text(f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO "{role}"')
            )
            connection.execute(
                text(f'GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA public TO "{role}"')
            )
    finally:
        engine.dispose()
    return make_url(url).set(username=role, password=None).render_as_string(hide_password=False)


def table_names(url: str) -> list[str]:
    engine = create_engine(normalize_url(url))
    try:
        return inspect(engine).get_table_names()
    finally:
        engine.dispose()


def assert_cannot_create_tables(url: str) -> None:
    engine = create_engine(normalize_url(url))
    try:
        with engine.connect() as connection, pytest.raises(ProgrammingError, match="permission denied"):
            connection.execute(text("CREATE TABLE intruder (id integer)"))
    finally:
        engine.dispose()


def test_migrate_apart_then_a_role_without_ddl_rights_serves_with_no_migrate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    role = f"tiletune_app_{uuid.uuid4().hex[:8]}"
    admin = create_engine(normalize_url(POSTGRES_ADMIN_URL), isolation_level="AUTOCOMMIT")
    try:
        with postgres_database() as url:
            status, checked = migrate_json(capsys, "--db", url, "--check")
            assert status == 1
            assert (checked["from_revision"], checked["at_head"]) == (None, False)
            assert not table_names(url), "--check changed nothing"

            refused = run_cli("server", "--no-migrate", "--db", url, "--port", str(free_port()), timeout_s=60)
            assert refused.returncode == 1
            assert "never migrated" in refused.stderr
            assert "run `tiletune migrate" in refused.stderr

            status, migrated = migrate_json(capsys, "--db", url)
            assert status == 0
            assert migrated["from_revision"] is None
            assert migrated["to_revision"] == migrated["head"] == head_revision()
            assert migrated["changed"] is True
            assert migrate_json(capsys, "--db", url)[1]["changed"] is False  # again: nothing to do
            assert migrate_json(capsys, "--db", url, "--check")[0] == 0

            rows_only = grant_rows_only(url, role)
            assert_cannot_create_tables(rows_only)
            serve_lookups_and_a_sweep(tmp_path, rows_only)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP ROLE IF EXISTS "{role}"'))
        admin.dispose()


def serve_lookups_and_a_sweep(folder: Path, url: str) -> None:
    """``tiletune server --no-migrate`` on ``url``: a registration, a lookup, a sweep, a lease."""
    port = free_port()
    log_path = folder / "server.log"
    args = ["server", "--no-migrate", "--db", url, "--port", str(port)]
    process = spawn(args, log_path, FAST_LEASES, SERVER_TILETUNE)
    server = f"http://127.0.0.1:{port}"
    try:
        wait_for_health(server, process, log_path, START_TIMEOUT_S)
        with httpx.Client(base_url=server, headers=ADMIN, timeout=10) as http:
            worker = {"name": "w", "chip": CHIP, "backends": ["torch"], "software": {"torch": "2.13.0"}}
            registered = http.post("/v1/workers", json=worker)
            assert registered.status_code == 201, registered.text
            lookup = {"shape": "n=4096", "chip": CHIP["name"], "dtype": "float32"}
            assert http.get("/v1/configs/add", params=lookup).json()["match"] == "default"
            sweep = {"kernel": "add", "shapes": [{"n": 4096}], "dtypes": ["float32"], "trials": 3}
            assert http.post("/v1/sweeps", json=sweep).status_code == 201
            leased = http.post("/v1/leases", json={"worker_id": registered.json()["id"]})
            assert leased.status_code == 201, leased.text
            assert http.get("/readyz").status_code == 200
    finally:
        stop(process)


def test_migrate_on_sqlite_reports_revisions_and_check_exits_1_until_migrated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'm.db'}"
    assert main(["migrate", "--db", url, "--check"]) == 1
    assert "not at head" in capsys.readouterr().out
    assert main(["migrate", "--db", url]) == 0
    assert f"from revision none (never migrated) to {head_revision()}" in capsys.readouterr().out
    assert main(["migrate", "--db", url, "--check", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document == {
        "database": url,
        "from_revision": head_revision(),
        "to_revision": head_revision(),
        "head": head_revision(),
        "at_head": True,
        "changed": False,
    }
    assert VERSION_TABLE in table_names(url)


def test_migrate_names_a_bad_url_and_hides_an_unreachable_ones_password(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["migrate", "--db", "nosuchdialect://x"]) == 2
    assert "error: db: not a usable database URL" in capsys.readouterr().err
    assert main(["migrate", "--db", "postgresql://someone:hunter2@127.0.0.1:1/x", "--check"]) == 1
    error = capsys.readouterr().err
    assert "cannot migrate the database postgresql://someone:***@127.0.0.1:1/x" in error
    assert "hunter2" not in error
