"""Tokens a deployment supplies: only generated ones start a server, and ``TILETUNE_WORKER_TOKEN`` is a
worker token the server knows.

- The rule (:mod:`tiletune.service.access.token_strength`): what the server mints and the documented
  commands make passes; placeholders, short, prefix-less and repeated values are refused.
- ``tiletune server`` (the torch-free install's, a real process) refuses a weak
  ``TILETUNE_ADMIN_TOKEN`` or ``TILETUNE_WORKER_TOKEN`` with exit 2, a message naming the variable
  and the command that makes a good one, never the value, and touches no database.
- A server started with ``TILETUNE_WORKER_TOKEN`` lets a worker register and lease with it;
  restarts keep one such token, a revoked one is never made again; replicas starting together on
  PostgreSQL make one row each of the admin and the worker token.
"""

from __future__ import annotations

import logging
import secrets
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr, ValidationError
from sqlalchemy import create_engine, delete, select

from tests.credentials import ADMIN, ADMIN_SECRET, ADMIN_TOKEN
from tests.service.processes import SERVER_TILETUNE, environment, free_port, start_server, stop
from tiletune.service.access.auth import DEPLOY_WORKER_NAME, new_secret
from tiletune.service.access.token_strength import GENERATE_COMMAND, token_weakness
from tiletune.service.app import create_app
from tiletune.service.database import normalize_url
from tiletune.service.migrate import upgrade
from tiletune.service.models import TokenRow
from tiletune.service.settings import Settings

#: The deployment's worker token of these tests (as ``openssl rand -hex 32`` makes one).
WORKER_TOKEN = "tt_" + secrets.token_hex(32)
WORKER = {"Authorization": f"Bearer {WORKER_TOKEN}"}

#: Values a deployment might leave in place, each refused.
WEAK_TOKENS = {
    "placeholder": "CHANGE-ME",
    "placeholder with the prefix": "tt_changeme-0123456789abcdefghijklmnopqrstuvwxyz",
    "short": "tt_k3Jd9Qz2",
    "no prefix": "Qm7vX2pL9sR4tY8wZ1aB6cD3eF5gH0jK",
    "repeated": "tt_" + "x" * 40,
    "few characters": "tt_" + "ab12" * 10,
}

CHIP: dict[str, Any] = {"name": "cpu/Deploy Test Chip", "kind": "cpu", "local_memory_bytes": 1 << 20}
WORKER_BODY = {"name": "w", "chip": CHIP, "backends": ["torch"]}


# -- the rule ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("token", WEAK_TOKENS.values(), ids=WEAK_TOKENS.keys())
def test_weak_tokens_are_refused_with_a_reason_that_never_quotes_them(token: str) -> None:
    reason = token_weakness(token)
    assert reason is not None
    assert token not in reason


def test_minted_and_documented_tokens_pass() -> None:
    made = [new_secret() for _ in range(500)]
    made += ["tt_" + secrets.token_urlsafe(32) for _ in range(200)]
    made += ["tt_" + secrets.token_hex(32) for _ in range(500)]
    if shutil.which("openssl"):
        hex_digits = subprocess.run(
            ["openssl", "rand", "-hex", "32"], capture_output=True, text=True, check=True
        ).stdout.strip()
        made.append("tt_" + hex_digits)
    documented = subprocess.run(GENERATE_COMMAND, shell=True, capture_output=True, text=True, check=True)
    made.append(documented.stdout.strip())

    assert [token for token in made if token_weakness(token) is not None] == []
    assert token_weakness(ADMIN_TOKEN) is None


def test_settings_refuse_weak_tokens_without_showing_them() -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(admin_token=SecretStr("CHANGE-ME"))
    assert "CHANGE-ME" not in str(refused.value)
    assert refused.value.errors()[0]["loc"] == ("admin_token",)
    with pytest.raises(ValidationError) as reused:
        Settings(admin_token=ADMIN_SECRET, worker_token=ADMIN_SECRET)
    assert reused.value.errors()[0]["loc"] == ("worker_token",)
    assert ADMIN_TOKEN not in str(reused.value)
    unset = Settings(admin_token=SecretStr(""), worker_token=SecretStr(""))
    assert (unset.admin_token, unset.worker_token) == (None, None)


# -- the real server --------------------------------------------------------------------------------


def serve_and_fail(folder: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``tiletune server`` with ``env``, expected to stop at once."""
    database = folder / "t.db"
    return subprocess.run(
        [SERVER_TILETUNE, "server", "--db", f"sqlite:///{database}", "--port", str(free_port())],
        capture_output=True,
        text=True,
        env=environment(env),
        timeout=60,
        check=False,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize(
    "token",
    [WEAK_TOKENS[name] for name in ("placeholder", "short", "no prefix", "repeated")],
    ids=["placeholder", "short", "no prefix", "repeated"],
)
def test_the_server_refuses_a_weak_admin_token(tmp_path: Path, token: str) -> None:
    result = serve_and_fail(tmp_path, {"TILETUNE_ADMIN_TOKEN": token})

    assert result.returncode == 2, result.stderr
    message = result.stderr.strip()
    assert message.startswith("tiletune server: error: admin_token: not a generated token: ")
    assert "$TILETUNE_ADMIN_TOKEN" in message
    assert GENERATE_COMMAND in message
    assert "Traceback" not in message
    assert len(message.splitlines()) == 1
    assert token not in result.stdout + result.stderr
    assert not (tmp_path / "t.db").exists()  # nothing touched


def test_the_server_refuses_a_weak_worker_token(tmp_path: Path) -> None:
    result = serve_and_fail(tmp_path, {"TILETUNE_WORKER_TOKEN": "CHANGE-ME"})

    assert result.returncode == 2, result.stderr
    assert "worker_token: not a generated token" in result.stderr
    assert "$TILETUNE_WORKER_TOKEN" in result.stderr
    assert "CHANGE-ME" not in result.stdout + result.stderr
    assert not (tmp_path / "t.db").exists()


def deploy_workers(http: httpx.Client, admin: dict[str, str]) -> list[dict[str, Any]]:
    """The tokens named :data:`DEPLOY_WORKER_NAME` the server lists."""
    listed = http.get("/v1/tokens", headers=admin)
    assert listed.status_code == 200, listed.text
    return [token for token in listed.json() if token["name"] == DEPLOY_WORKER_NAME]


def test_a_worker_works_with_the_deployments_token_until_revoked_even_after_a_restart(tmp_path: Path) -> None:
    """No admin token given: the server makes and shows the first admin even though the worker
    token is in the database first. Revoked, the worker token is not made again at restart."""
    env = {"TILETUNE_ADMIN_TOKEN": "", "TILETUNE_WORKER_TOKEN": WORKER_TOKEN}
    server = start_server(tmp_path, env=env)
    try:
        lines = server.log().splitlines()
        shown = lines[next(i for i, line in enumerate(lines) if "the first admin token" in line) + 1]
        admin = {"Authorization": f"Bearer {shown.strip()}"}
        with httpx.Client(base_url=server.url, timeout=30) as http:
            registered = http.post("/v1/workers", json=WORKER_BODY, headers=WORKER)
            assert registered.status_code == 201, registered.text
            sweep = {"kernel": "add", "shapes": [{"n": 4096}], "chips": [CHIP["name"]]}
            assert http.post("/v1/sweeps", json=sweep, headers=admin).status_code == 201
            leased = http.post("/v1/leases", json={"worker_id": registered.json()["id"]}, headers=WORKER)
            assert leased.status_code == 201, leased.text
            [made] = deploy_workers(http, admin)
            assert (made["role"], made["chip"], made["revoked_at"]) == ("worker", "*", None)
            assert http.post(f"/v1/tokens/{made['id']}/revoke", headers=admin).status_code == 200
    finally:
        stop(server.process)

    server = start_server(tmp_path, db_url=server.db_url, port=server.port, env=env, log_name="again.log")
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            [kept] = deploy_workers(http, admin)
            assert kept["id"] == made["id"]
            assert kept["revoked_at"] is not None
            refused = http.post("/v1/workers", json=WORKER_BODY, headers=WORKER)
            assert refused.status_code == 401, refused.text
        log = server.log()
        revoked = f"it is the token 'deploy-worker' (id {made['id']}), revoked"
        assert f"TILETUNE_WORKER_TOKEN is ignored: {revoked}" in log
        assert "the first admin token" not in log
        assert WORKER_TOKEN not in (tmp_path / "server.log").read_text() + log
    finally:
        stop(server.process)


def test_a_restart_keeps_the_one_worker_token(database_url: str, caplog: pytest.LogCaptureFixture) -> None:
    upgrade(database_url)
    settings = Settings(db_url=database_url, admin_token=ADMIN_SECRET, worker_token=SecretStr(WORKER_TOKEN))
    create_app(settings, reaper=False)
    caplog.set_level(logging.INFO, logger="tiletune.service.access.auth")
    caplog.clear()  # the first start's "is now the worker token" line; the restart must say nothing

    with TestClient(create_app(settings, reaper=False)) as client:
        assert client.post("/v1/workers", json=WORKER_BODY, headers=WORKER).status_code == 201
        [kept] = deploy_workers(client, ADMIN)

    assert (kept["role"], kept["chip"], kept["revoked_at"]) == ("worker", "*", None)
    # The auth module's lines only: other modules log at INFO once a command configured logging.
    assert [record for record in caplog.records if record.name == "tiletune.service.access.auth"] == []


# -- replicas starting together ---------------------------------------------------------------------


def start_together(settings: Settings, replicas: int) -> list[BaseException]:
    """Make ``replicas`` apps of ``settings`` at once (threads past one barrier); what they raised."""
    barrier = threading.Barrier(replicas)
    failures: list[BaseException] = []

    def start() -> None:
        barrier.wait()
        try:
            create_app(settings, reaper=False)
        except BaseException as error:
            failures.append(error)

    threads = [threading.Thread(target=start) for _ in range(replicas)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return failures


def test_replicas_starting_together_make_one_admin_and_one_worker_token(database_url: str) -> None:
    """Each round: the tokens table emptied, then four apps made at once with the same secrets."""
    upgrade(database_url)
    settings = Settings(db_url=database_url, admin_token=ADMIN_SECRET, worker_token=SecretStr(WORKER_TOKEN))
    engine = create_engine(normalize_url(database_url))
    try:
        for _ in range(3):
            with engine.begin() as connection:
                connection.execute(delete(TokenRow))

            assert start_together(settings, 4) == []

            with engine.connect() as connection:
                rows = connection.execute(select(TokenRow.name, TokenRow.role, TokenRow.chip_name)).all()
            assert sorted(map(tuple, rows)) == [("admin", "admin", None), ("deploy-worker", "worker", "*")]
    finally:
        engine.dispose()
