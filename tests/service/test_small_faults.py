"""The fleet's small faults, each answered as it should be.

- A client that goes away mid-request is counted as ``499`` in ``tiletune_request_seconds``, not
  as a server error (a real server process, a raw socket that closes before its body is sent).
- A database that goes away while the body guard checks a large body's caller is 503, not 500.
- A full disk (SQLite's ``SQLITE_FULL``, as its ``max_page_count`` raises it) is ``507
  storage_full``, naming the disk, with nothing written; reads go on.
- Sweeps are limited per token (429 with ``Retry-After``); another token keeps its budget.
- An earlier worker's lease URL (the token in the path) is logged without the token.
- A chip name that differs from a registered one only in case or spaces is refused (409), naming
  the registered one: look-alike names name one chip; the very name, committed meanwhile by a
  concurrent registration, is no look-alike.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.orm import Session

from tests.credentials import ADMIN, ADMIN_SECRET
from tests.service.conftest import POSTGRES_ADMIN_URL, postgres_database, snapshot
from tests.service.processes import start_server, stop
from tiletune.service import fleet
from tiletune.service.app import create_app
from tiletune.service.database import normalize_url
from tiletune.service.errors import ConflictError
from tiletune.service.migrate import upgrade
from tiletune.service.request_ids import ACCESS_LOGGER, REDACTED
from tiletune.service.settings import Settings

CHIP_NAME = "cpu/Look Alike Chip/2c"
CHIP = {"name": CHIP_NAME, "kind": "cpu", "local_memory_bytes": 1 << 20}
WORKER = {"name": "w", "chip": CHIP, "backends": ["torch"]}


def _sweep(first_n: int, shapes: int = 1) -> dict[str, object]:
    return {"kernel": "add", "shapes": [{"n": first_n + i} for i in range(shapes)], "trials": 3}


def test_a_client_that_goes_away_mid_request_is_not_a_server_error(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    try:
        head = (
            f"POST /v1/sweeps HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {ADMIN['Authorization']}\r\n"
            'Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"kernel": '
        )
        with socket.create_connection(("127.0.0.1", server.port)) as raw:
            raw.sendall(head.encode())
            time.sleep(0.5)  # the server is reading the body when the client goes
        deadline = time.monotonic() + 10
        counted: dict[str, float] = {}
        while time.monotonic() < deadline and "499" not in counted:
            exposition = httpx.get(f"{server.url}/metrics", timeout=10).text
            pattern = r'^tiletune_request_seconds_count\{method="POST",route="[^"]+",status="(\d+)"\} (\S+)$'
            counted = {status: float(n) for status, n in re.findall(pattern, exposition, re.MULTILINE)}
            time.sleep(0.2)
    finally:
        stop(server.process)
    assert counted == {"499": 1.0}


def test_a_full_disk_is_507_and_writes_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'full.db'}"
    upgrade(url)
    app = create_app(Settings(db_url=url, admin_token=ADMIN_SECRET), reaper=False)
    with TestClient(app, headers=ADMIN) as client:
        assert client.post("/v1/sweeps", json=_sweep(64)).status_code == 201
        engine: Engine = app.state.services.db.sessions.kw["bind"]

        @event.listens_for(engine, "connect")
        def _no_more_pages(connection: object, _record: object) -> None:
            cursor = connection.cursor()  # type: ignore[attr-defined]
            pages = cursor.execute("PRAGMA page_count").fetchone()[0]
            cursor.execute(f"PRAGMA max_page_count = {pages}")

        engine.dispose()  # the pool's next connections are the full disk's
        before = snapshot(url)
        full = client.post("/v1/sweeps", json=_sweep(1_000, shapes=500))
        assert full.status_code == 507, full.text
        assert full.json() == {
            "code": "storage_full",
            "message": "the database's disk is full: nothing was written; free space on it, then try again",
            "field": None,
        }
        assert int(full.headers["retry-after"]) >= 1
        assert client.get("/v1/jobs").status_code == 200
    assert snapshot(url) == before


def test_a_database_gone_while_a_large_bodys_caller_is_checked_is_503_not_500() -> None:
    """The body guard authenticates a large body's caller before any route runs: a database fault
    there is the database's (503), as it is in a route."""
    admin = create_engine(normalize_url(POSTGRES_ADMIN_URL), isolation_level="AUTOCOMMIT")
    with postgres_database() as url:
        upgrade(url)
        name = url.rsplit("/", 1)[1]
        app = create_app(Settings(db_url=url, admin_token=ADMIN_SECRET), reaper=False)
        with TestClient(app, raise_server_exceptions=False) as client:
            reader = client.post("/v1/tokens", json={"role": "reader"}, headers=ADMIN).json()["token"]
            with admin.connect() as connection:
                connection.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false'))
                connection.execute(
                    text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :name"),
                    {"name": name},
                )
            try:
                misses = [
                    {"kernel": "add", "shape": {"n": n}, "dtype": "float32", "chip": "c"} for n in range(200)
                ]
                headers = {"Authorization": f"Bearer {reader}", "Content-Type": "application/json"}
                answer = client.post("/v1/misses", content=json.dumps({"misses": misses}), headers=headers)
            finally:
                with admin.connect() as connection:
                    connection.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true'))
        app.state.services.db.sessions.kw["bind"].dispose()
    admin.dispose()
    assert answer.status_code == 503, answer.text
    assert answer.json()["code"] == "database_unavailable"
    assert int(answer.headers["retry-after"]) >= 1


def test_sweeps_are_limited_per_token(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'sweeps.db'}"
    upgrade(url)
    settings = Settings(db_url=url, admin_token=ADMIN_SECRET, sweep_burst=3, sweeps_per_s=0.001)
    with TestClient(create_app(settings, reaper=False), headers=ADMIN) as client:
        made = [client.post("/v1/sweeps", json=_sweep(64 + i)).status_code for i in range(3)]
        assert made == [201, 201, 201]
        limited = client.post("/v1/sweeps", json=_sweep(100))
        assert limited.status_code == 429, limited.text
        assert limited.json()["message"] == "too many sweeps from this token; try again later"
        assert int(limited.headers["retry-after"]) >= 1
        other = client.post("/v1/tokens", json={"role": "submitter"}).json()["token"]
        assert (
            client.post(
                "/v1/sweeps", json=_sweep(200), headers={"Authorization": f"Bearer {other}"}
            ).status_code
            == 201
        )


def test_an_earlier_workers_lease_url_is_logged_without_its_token(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"sqlite:///{tmp_path / 'logs.db'}"
    upgrade(url)
    lease_token = "Zq3xK9vLw2Bn7Yt5Rc8Pm1Hd4Gf6Js0A"  # the form of secrets.token_urlsafe(24)
    app = create_app(Settings(db_url=url, admin_token=ADMIN_SECRET), reaper=False)
    with TestClient(app) as client, caplog.at_level(logging.INFO, logger=ACCESS_LOGGER):
        assert client.post(f"/v1/leases/{lease_token}/heartbeat", headers=ADMIN).status_code in (404, 405)
        assert client.get("/v1/configs/fused_attention_backward", params={"shape": "x=1", "chip": "c"})
    lines = [record.getMessage() for record in caplog.records if record.name == ACCESS_LOGGER]
    assert any(f"/v1/leases/{REDACTED}/heartbeat" in line for line in lines), lines
    assert any("/v1/configs/fused_attention_backward" in line for line in lines), lines  # ours stay
    assert lease_token not in caplog.text


def test_look_alike_chip_names_name_one_chip(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'chips.db'}"
    upgrade(url)
    with TestClient(
        create_app(Settings(db_url=url, admin_token=ADMIN_SECRET), reaper=False), headers=ADMIN
    ) as client:
        assert client.post("/v1/workers", json=WORKER).status_code == 201
        for look_alike in ("CPU/look alike chip/2c", "cpu/Look  Alike Chip /2c", " cpu/Look Alike Chip/2C"):
            refused = client.post("/v1/workers", json={**WORKER, "chip": {**CHIP, "name": look_alike}})
            assert refused.status_code == 409, refused.text
            assert refused.json()["field"] == "chip.name"
            assert repr(CHIP["name"]) in refused.json()["message"]
        other = {**CHIP, "name": "cpu/Look Alike Chip/4c"}
        assert client.post("/v1/workers", json={**WORKER, "chip": other}).status_code == 201
        chips = {worker["chip"] for worker in client.get("/v1/workers").json()}
    assert chips == {CHIP["name"], "cpu/Look Alike Chip/4c"}


def test_a_chip_registered_meanwhile_under_the_very_name_is_no_look_alike() -> None:
    """Workers of a new chip registering at once (the compose path's replicas) on PostgreSQL.

    One registration's transaction looked the name up before another's committed it; its look-alike
    check, reading afterwards, sees the very name and lets the insert meet the unique name (the
    registration then runs again and finds the chip) instead of refusing the chip as its own
    look-alike.
    """
    with postgres_database() as url:
        upgrade(url)
        engine = create_engine(normalize_url(url))
        try:
            with Session(engine) as earlier, earlier.begin():
                assert fleet.chip_by_name(earlier, CHIP_NAME) is None
                app = create_app(Settings(db_url=url, admin_token=ADMIN_SECRET), reaper=False)
                with TestClient(app, headers=ADMIN) as client:
                    assert client.post("/v1/workers", json=WORKER).status_code == 201
                fleet.refuse_look_alike(earlier, CHIP_NAME)
                with pytest.raises(ConflictError):
                    fleet.refuse_look_alike(earlier, CHIP_NAME.upper())
        finally:
            engine.dispose()
