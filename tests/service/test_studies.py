"""Where Optuna's studies live, and setting them up from several server processes at once."""

from __future__ import annotations

import subprocess
import sys

from tiletune.service.studies import optuna_storage_url

from .conftest import postgres_database

SETUP = "import sys; from tiletune.service.studies import make_storage; make_storage(sys.argv[1])"


def test_optuna_lives_beside_a_sqlite_database_or_in_its_own_postgres_schema() -> None:
    assert optuna_storage_url("sqlite:///data/t.db", None) == "journal:data/t.optuna.log"
    assert optuna_storage_url("sqlite://", None) == "memory"
    assert optuna_storage_url("postgresql://h/db", None) == "postgresql+psycopg://h/db"
    assert optuna_storage_url("sqlite:///t.db", "sqlite:///elsewhere.db") == "sqlite:///elsewhere.db"


def test_replicas_starting_at_once_on_a_new_postgres_database_all_set_optuna_up() -> None:
    with postgres_database() as url:
        command = [sys.executable, "-c", SETUP, url]
        setups = [subprocess.Popen(command, stderr=subprocess.PIPE) for _ in range(3)]
        failures = [p.stderr.read().decode() for p in setups if p.wait(timeout=120) != 0 and p.stderr]
        assert failures == []
