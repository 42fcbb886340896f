"""A worker token works for one chip, and a refusal tells nothing of any chip's limits.

On SQLite and PostgreSQL through the real app; the command line against a real server (uvicorn
on a thread). Each refusal is 403 with the error body and changes nothing.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient
from sqlalchemy import inspect, text

from tests.credentials import ADMIN, ADMIN_SECRET, ADMIN_TOKEN
from tests.service.conftest import snapshot
from tests.service.processes import free_port
from tiletune.service.app import create_app
from tiletune.service.cli.main import main
from tiletune.service.database import make_engine
from tiletune.service.migrate import downgrade, upgrade
from tiletune.service.settings import Settings

#: Chip A's limits are odd numbers no message would hold by chance.
CHIP_A: dict[str, Any] = {
    "name": "npu/Chip Alpha",
    "kind": "npu",
    "local_memory_bytes": 1_234_567,
    "max_buffer_num": 7,
    "alignment_bytes": 96,
}
CHIP_B: dict[str, Any] = {"name": "cpu/Chip Beta", "kind": "cpu", "local_memory_bytes": 1 << 20}
LIMITS_OF_A = ("1234567", "1_234_567", "96", "npu',", "'npu'")


def worker_on(chip: dict[str, Any], name: str = "w") -> dict[str, Any]:
    return {"name": name, "chip": chip, "backends": ["torch"]}


@dataclass
class World:
    """A served app (admin headers by default) and its database's URL."""

    client: TestClient
    url: str

    def token(self, role: str = "worker", **fields: Any) -> dict[str, str]:
        """The headers of a new token of ``role`` (named ``a ROLE`` unless ``fields`` name it)."""
        made = self.client.post("/v1/tokens", json={"role": role, "name": f"a {role}", **fields})
        assert made.status_code == 201, made.text
        return {"Authorization": f"Bearer {made.json()['token']}"}

    def binding(self, name: str) -> str | None:
        """The chip ``GET /v1/tokens`` shows for the token named ``name``."""
        listed = self.client.get("/v1/tokens").json()
        chip: str | None = next(token for token in listed if token["name"] == name).get("chip")
        return chip

    def unbind_all(self) -> None:
        """Clear every binding, as a database from before bindings holds its tokens (none if it
        has no bindings at all)."""
        engine = make_engine(self.url)
        try:
            if "chip_name" not in {column["name"] for column in inspect(engine).get_columns("tokens")}:
                return
            with engine.begin() as connection:
                connection.execute(text("UPDATE tokens SET chip_name = NULL"))
        finally:
            engine.dispose()


@pytest.fixture
def world(database_url: str) -> Iterator[World]:
    upgrade(database_url)
    settings = Settings(db_url=database_url, admin_token=ADMIN_SECRET, open_reads=False)
    with TestClient(create_app(settings, reaper=False), headers=ADMIN) as client:
        yield World(client, database_url)


def assert_bound_elsewhere(response: Any, field: str) -> None:
    assert response.status_code == 403, response.text
    body = response.json()
    assert body["code"] == "forbidden"
    assert body["field"] == field
    assert "bound to another chip" in body["message"]
    assert CHIP_A["name"] not in body["message"]
    assert not any(limit in body["message"] for limit in LIMITS_OF_A)


def test_a_worker_token_works_for_the_chip_of_its_first_registration_only(world: World) -> None:
    worker = world.token()
    assert world.client.post("/v1/workers", json=worker_on(CHIP_A), headers=worker).status_code == 201
    assert world.client.post("/v1/workers", json=worker_on(CHIP_A, "w2"), headers=worker).status_code == 201
    before = snapshot(world.url)

    refused = world.client.post("/v1/workers", json=worker_on(CHIP_B), headers=worker)

    assert_bound_elsewhere(refused, "chip.name")
    assert snapshot(world.url) == before  # chip B was not created
    assert world.binding("a worker") == CHIP_A["name"]


def test_a_token_created_for_a_chip_registers_that_chip_only(world: World) -> None:
    made = world.client.post("/v1/tokens", json={"role": "worker", "name": "for a", "chip": CHIP_A["name"]})
    assert made.status_code == 201, made.text
    assert made.json()["chip"] == CHIP_A["name"]
    worker = {"Authorization": f"Bearer {made.json()['token']}"}
    before = snapshot(world.url)

    refused = world.client.post("/v1/workers", json=worker_on(CHIP_B), headers=worker)

    assert_bound_elsewhere(refused, "chip.name")
    assert snapshot(world.url) == before
    assert world.client.post("/v1/workers", json=worker_on(CHIP_A), headers=worker).status_code == 201
    assert world.binding("for a") == CHIP_A["name"]


def test_a_worker_token_cannot_lease_another_chips_jobs(world: World) -> None:
    """A token that ran workers on two chips before bindings is bound by its next lease."""
    worker = world.token()
    on_a = world.client.post("/v1/workers", json=worker_on(CHIP_A), headers=worker).json()["id"]
    world.unbind_all()
    on_b = world.client.post("/v1/workers", json=worker_on(CHIP_B), headers=worker).json()["id"]
    world.unbind_all()
    sweep = {"kernel": "add", "shapes": [{"n": 4096}], "chips": [CHIP_A["name"], CHIP_B["name"]]}
    assert world.client.post("/v1/sweeps", json=sweep).status_code == 201

    leased = world.client.post("/v1/leases", json={"worker_id": on_a}, headers=worker)
    assert leased.status_code == 201, leased.text
    before = snapshot(world.url)

    refused = world.client.post("/v1/leases", json={"worker_id": on_b}, headers=worker)

    assert_bound_elsewhere(refused, "worker_id")
    assert snapshot(world.url) == before  # chip B's job is still queued
    jobs = world.client.get("/v1/jobs", params={"state": "queued"}).json()
    assert [job["chip"] for job in jobs] == [CHIP_B["name"]]
    assert world.binding("a worker") == CHIP_A["name"]


def test_the_limits_refusal_tells_nothing_of_the_registered_limits(world: World) -> None:
    assert world.client.post("/v1/workers", json=worker_on(CHIP_A)).status_code == 201  # the admin's
    worker = world.token()
    before = snapshot(world.url)
    other_limits = {**CHIP_A, "kind": "cpu", "local_memory_bytes": 1 << 20, "max_buffer_num": 4}

    refused = world.client.post("/v1/workers", json=worker_on(other_limits), headers=worker)

    assert refused.status_code == 403, refused.text
    assert refused.json()["field"] == "chip"
    assert "other limits" in refused.json()["message"]
    assert not any(limit in refused.json()["message"] for limit in LIMITS_OF_A), refused.json()
    assert snapshot(world.url) == before
    assert world.binding("a worker") is None  # a refused registration binds nothing


def test_admins_work_for_any_chip(world: World) -> None:
    sweep = {"kernel": "add", "shapes": [{"n": 4096}], "chips": [CHIP_A["name"], CHIP_B["name"]]}
    ids = [world.client.post("/v1/workers", json=worker_on(chip)).json()["id"] for chip in (CHIP_A, CHIP_B)]
    assert world.client.post("/v1/sweeps", json=sweep).status_code == 201

    leases = [world.client.post("/v1/leases", json={"worker_id": worker_id}) for worker_id in ids]

    assert [lease.status_code for lease in leases] == [201, 201]
    shrunk = {**CHIP_A, "local_memory_bytes": 1 << 16}
    assert world.client.post("/v1/workers", json=worker_on(shrunk)).status_code == 201
    assert world.binding("admin") is None


@pytest.mark.parametrize(
    "fields",
    [{"role": "reader", "chip": "npu/Chip Alpha"}, {"role": "admin", "chip": "*"}, {"chip": "a\u202eb"}],
)
def test_a_chip_binds_worker_tokens_only(world: World, fields: dict[str, str]) -> None:
    before = snapshot(world.url)
    refused = world.client.post("/v1/tokens", json={"role": "worker", "name": "x", **fields})
    assert refused.status_code == 422, refused.text
    assert refused.json()["field"] == "chip"
    assert snapshot(world.url) == before


def test_a_token_for_every_chip_works_for_any(world: World) -> None:
    made = world.client.post("/v1/tokens", json={"role": "worker", "name": "fleet", "chip": "*"})
    worker = {"Authorization": f"Bearer {made.json()['token']}"}

    registered = [
        world.client.post("/v1/workers", json=worker_on(chip), headers=worker) for chip in (CHIP_A, CHIP_B)
    ]

    assert [response.status_code for response in registered] == [201, 201]
    assert world.binding("fleet") == "*"


def test_the_upgrade_binds_the_worker_tokens_in_use_as_they_were_used(database_url: str) -> None:
    """Tokens of one chip are bound to it, of several to every chip (none refused), of none later."""
    upgrade(database_url)
    settings = Settings(db_url=database_url, admin_token=ADMIN_SECRET, open_reads=False)
    with TestClient(create_app(settings, reaper=False), headers=ADMIN) as client:
        world = World(client, database_url)
        one, several = world.token(name="one"), world.token(name="several", chip="*")
        world.token(name="idle")
        assert client.post("/v1/workers", json=worker_on(CHIP_A), headers=one).status_code == 201
        for chip in (CHIP_A, CHIP_B):
            assert client.post("/v1/workers", json=worker_on(chip), headers=several).status_code == 201
    downgrade(database_url, "0007")  # the tokens as they were before bindings
    upgrade(database_url)

    with TestClient(create_app(settings, reaper=False), headers=ADMIN) as client:
        world = World(client, database_url)
        bindings = {name: world.binding(name) for name in ("one", "several", "idle", "admin")}
        assert bindings == {"one": CHIP_A["name"], "several": "*", "idle": None, "admin": None}


# -- the command line ---------------------------------------------------------------------------


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    """The app under uvicorn on a thread (a real server for the command line): its URL."""
    url = f"sqlite:///{tmp_path / 'server.db'}"
    upgrade(url)
    settings = Settings(db_url=url, admin_token=ADMIN_SECRET, open_reads=False)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(settings, reaper=False), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def test_token_create_binds_a_worker_token_to_its_chip(
    served: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TILETUNE_TOKEN", ADMIN_TOKEN)
    monkeypatch.delenv("TILETUNE_SERVER", raising=False)
    capsys.readouterr()

    status = main(["token", "create", "--role", "worker", "--name", "w-a", "--chip", CHIP_A["name"],
                   "--server", served, "--json"])  # fmt: skip
    created = capsys.readouterr()
    assert status == 0, created.err
    assert json.loads(created.out)["chip"] == CHIP_A["name"]
    as_worker = {"Authorization": f"Bearer {json.loads(created.out)['token']}"}
    refused_b = httpx.post(f"{served}/v1/workers", json=worker_on(CHIP_B), headers=as_worker)
    assert_bound_elsewhere(refused_b, "chip.name")
    assert main(["token", "list", "--server", served]) == 0
    listed = capsys.readouterr().out
    assert "chip" in listed.splitlines()[0]
    assert CHIP_A["name"] in listed

    refused = main(["token", "create", "--role", "reader", "--chip", CHIP_A["name"], "--server", served])
    assert refused == 2
    assert "chip" in capsys.readouterr().err
