"""Who may call what: every route against anonymous callers and every role, on SQLite and PostgreSQL.

Each refusal must be 401 (no or a bad token) or 403 (a valid token without the right) with the
error body, and change nothing: every table is read before and after and compared.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from tests.credentials import ADMIN, ADMIN_SECRET
from tests.service.conftest import snapshot
from tiletune.client.wire import Role
from tiletune.service.app import create_app
from tiletune.service.migrate import upgrade
from tiletune.service.settings import Settings

CHIP = {"name": "cpu/Auth Test Chip/2c", "kind": "cpu", "local_memory_bytes": 1 << 20}
WORKER = {"name": "w", "chip": CHIP, "backends": ["torch"]}
SWEEP = {"kernel": "add", "shapes": [{"n": 4096}], "trials": 3}
MISS = {"kernel": "add", "shape": {"n": 64}, "dtype": "float32", "chip": CHIP["name"], "match": "default"}

#: The least role each route needs (``None``: open to anyone, always).
POLICY: dict[tuple[str, str], Role | None] = {
    ("POST", "/v1/sweeps"): Role.SUBMITTER,
    ("GET", "/v1/sweeps"): Role.READER,
    ("GET", "/v1/sweeps/{sweep_id}"): Role.READER,
    ("POST", "/v1/sweeps/{sweep_id}/cancel"): Role.SUBMITTER,
    ("GET", "/v1/jobs"): Role.READER,
    ("GET", "/v1/jobs/{job_id}"): Role.READER,
    ("POST", "/v1/jobs/{job_id}/cancel"): Role.SUBMITTER,
    ("GET", "/v1/jobs/{job_id}/trials"): Role.READER,
    ("POST", "/v1/workers"): Role.WORKER,
    ("GET", "/v1/workers"): Role.READER,
    ("POST", "/v1/leases"): Role.WORKER,
    ("POST", "/v1/lease/heartbeat"): Role.WORKER,
    ("POST", "/v1/lease/ask"): Role.WORKER,
    ("POST", "/v1/lease/tell"): Role.WORKER,
    ("POST", "/v1/lease/complete"): Role.WORKER,
    ("POST", "/v1/lease/release"): Role.WORKER,
    ("GET", "/v1/configs/{kernel}"): Role.READER,
    ("GET", "/v1/configs"): Role.READER,
    ("POST", "/v1/configs/import"): Role.ADMIN,
    ("GET", "/v1/history/{kernel}"): Role.READER,
    ("POST", "/v1/misses"): Role.READER,
    ("GET", "/v1/misses"): Role.READER,
    ("POST", "/v1/client-stats"): Role.READER,
    ("POST", "/v1/tokens"): Role.ADMIN,
    ("GET", "/v1/tokens"): Role.ADMIN,
    ("POST", "/v1/tokens/{token_id}/revoke"): Role.ADMIN,
    ("GET", "/livez"): None,
    ("GET", "/healthz"): None,
    ("GET", "/readyz"): None,
    ("GET", "/metrics"): Role.READER,
}

CALLERS = ("anonymous", "bogus", *(role.value for role in Role))


@dataclass
class World:
    """A served app with a token per role, a sweep of the submitter, a lease of the worker's worker."""

    client: TestClient
    url: str
    tokens: dict[str, str]
    sweep_id: int
    job_id: int
    lease_token: str
    worker_id: int

    def headers(self, caller: str) -> dict[str, str]:
        if caller == "anonymous":
            return {}
        secret = "tt_not-a-token-anybody-made" if caller == "bogus" else self.tokens[caller]
        return {"Authorization": f"Bearer {secret}"}


@pytest.fixture
def world(database_url: str) -> Iterator[World]:
    upgrade(database_url)
    settings = Settings(db_url=database_url, admin_token=ADMIN_SECRET, open_reads=False)
    with TestClient(create_app(settings, reaper=False)) as client:
        tokens = {Role.ADMIN.value: ADMIN["Authorization"].split()[1]}
        for role in (Role.SUBMITTER, Role.WORKER, Role.READER):
            made = client.post("/v1/tokens", json={"role": role.value, "name": role.value}, headers=ADMIN)
            assert made.status_code == 201, made.text
            tokens[role.value] = made.json()["token"]
        as_worker = {"Authorization": f"Bearer {tokens['worker']}"}
        as_submitter = {"Authorization": f"Bearer {tokens['submitter']}"}
        worker_id = client.post("/v1/workers", json=WORKER, headers=as_worker).json()["id"]
        sweep = client.post("/v1/sweeps", json=SWEEP, headers=as_submitter).json()
        lease = client.post("/v1/leases", json={"worker_id": worker_id}, headers=as_worker).json()
        yield World(
            client, database_url, tokens, sweep["id"], sweep["jobs"][0]["id"], lease["token"], worker_id
        )


def request_of(world: World, method: str, path: str) -> tuple[str, dict[str, Any]]:
    """A plausible request of a route: its path filled in, a body that would be accepted."""
    filled = (
        path.replace("{sweep_id}", str(world.sweep_id))
        .replace("{job_id}", str(world.job_id))
        .replace("{token_id}", "1")
        .replace("{kernel}", "add")
    )
    bodies: dict[str, Any] = {
        "/v1/sweeps": SWEEP,
        "/v1/workers": {**WORKER, "name": "intruder"},
        "/v1/leases": {"worker_id": world.worker_id},
        "/v1/tokens": {"role": "admin", "name": "intruder"},
        "/v1/misses": {"misses": [{**MISS, "count": 100}]},
        "/v1/client-stats": {"chip": CHIP["name"], "answers": {"exact": 100}},
        "/v1/configs/import": {"configs": []},
    }
    kwargs: dict[str, Any] = {}
    if path.startswith("/v1/lease/"):
        kwargs["headers"] = {"X-Lease-Token": world.lease_token}
    if method == "POST":
        if path.endswith("/tell"):
            kwargs["json"] = {"outcomes": [{"trial_id": 0, "error": "made up"}]}
        elif path.endswith("/complete"):
            kwargs["json"] = {"results": [{"config": {"tile_size": 1}, "error": "made up"}]}
        elif path.endswith("/release"):
            kwargs["json"] = {"reason": "made up", "failed": True}
        elif path in bodies:
            kwargs["json"] = bodies[path]
    if path.startswith(("/v1/configs/{kernel}", "/v1/history")):
        kwargs["params"] = {"shape": "n=64", "chip": CHIP["name"]}
    if path == "/v1/configs":
        kwargs["params"] = {"chip": CHIP["name"]}
    return filled, kwargs


def allowed(role: Role | None, caller: str) -> bool:
    if role is None:
        return True
    if caller in ("anonymous", "bogus"):
        return False
    return caller in (Role.ADMIN.value, role.value) or role == Role.READER


def test_every_route_has_a_policy(world: World) -> None:
    paths = world.client.get("/openapi.json").json()["paths"]
    routes = {(method.upper(), path) for path, operations in paths.items() for method in operations}
    assert routes == set(POLICY)


def test_every_refusal_is_401_or_403_and_changes_nothing(world: World) -> None:
    before = snapshot(world.url)
    refused = 0
    for (method, path), role in POLICY.items():
        for caller in CALLERS:
            if allowed(role, caller):
                continue
            filled, kwargs = request_of(world, method, path)
            headers = {**kwargs.pop("headers", {}), **world.headers(caller)}
            response = world.client.request(method, filled, headers=headers, **kwargs)
            expected = 401 if caller in ("anonymous", "bogus") else 403
            assert response.status_code == expected, (method, path, caller, response.text)
            assert response.json()["code"] == ("unauthorized" if expected == 401 else "forbidden")
            if expected == 401:
                assert response.headers["www-authenticate"] == "Bearer"
            refused += 1
    assert refused > 60
    assert snapshot(world.url) == before


def test_readers_read_and_every_valid_token_may(world: World) -> None:
    for caller in ("reader", "submitter", "worker", "admin"):
        for (method, path), role in POLICY.items():
            if method != "GET" or role != Role.READER:
                continue
            filled, kwargs = request_of(world, method, path)
            response = world.client.get(filled, headers=world.headers(caller), **kwargs)
            assert response.status_code not in (401, 403), (path, caller, response.text)


def _second(world: World, role: Role) -> dict[str, str]:
    made = world.client.post("/v1/tokens", json={"role": role.value, "name": "second"}, headers=ADMIN)
    return {"Authorization": f"Bearer {made.json()['token']}"}


def test_a_worker_cannot_pose_as_another_tokens_worker(world: World) -> None:
    other = _second(world, Role.WORKER)
    before = snapshot(world.url)

    leased = world.client.post("/v1/leases", json={"worker_id": world.worker_id}, headers=other)
    leased_as_other = {**other, "X-Lease-Token": world.lease_token}
    asked = world.client.post("/v1/lease/ask", headers=leased_as_other)
    told = world.client.post(
        "/v1/lease/tell",
        json={"outcomes": [{"trial_id": 0, "measurement": {"median_ms": 1e-6, "p10_ms": 1e-6, "p90_ms": 1e-6,
                                                            "min_ms": 1e-6, "samples": 1}}]},
        headers=leased_as_other,
    )  # fmt: skip

    assert [leased.status_code, asked.status_code, told.status_code] == [403, 403, 403]
    assert snapshot(world.url) == before


def test_a_submitter_cancels_its_own_sweeps_only(world: World) -> None:
    other = _second(world, Role.SUBMITTER)
    before = snapshot(world.url)
    assert world.client.post(f"/v1/sweeps/{world.sweep_id}/cancel", headers=other).status_code == 403
    assert world.client.post(f"/v1/jobs/{world.job_id}/cancel", headers=other).status_code == 403
    assert snapshot(world.url) == before

    owner = world.headers("submitter")
    cancelled = world.client.post(f"/v1/sweeps/{world.sweep_id}/cancel", headers=owner)
    assert cancelled.status_code == 200
    assert [job["state"] for job in cancelled.json()["jobs"]] == ["cancelled"]


def test_only_an_admin_changes_a_chips_limits_and_star_is_no_chip(world: World) -> None:
    as_worker = world.headers("worker")
    before = snapshot(world.url)
    shrunk = {**WORKER, "chip": {**CHIP, "local_memory_bytes": 64}}
    star = {**WORKER, "chip": {**CHIP, "name": "*"}}

    assert world.client.post("/v1/workers", json=shrunk, headers=as_worker).status_code == 403
    assert world.client.post("/v1/workers", json=star, headers=as_worker).status_code == 422
    assert snapshot(world.url) == before
    assert world.client.post("/v1/workers", json=shrunk, headers=ADMIN).status_code == 201


def test_a_revoked_token_is_refused_at_once(world: World) -> None:
    listed = world.client.get("/v1/tokens", headers=ADMIN).json()
    reader = next(token for token in listed if token["name"] == "reader")
    assert all("token" not in token and "digest" not in token for token in listed)

    revoked = world.client.post(f"/v1/tokens/{reader['id']}/revoke", headers=ADMIN)

    assert revoked.json()["revoked_at"] is not None
    assert world.client.get("/v1/jobs", headers=world.headers("reader")).status_code == 401


def test_a_token_cannot_revoke_itself(world: World) -> None:
    admin_id = next(
        t["id"] for t in world.client.get("/v1/tokens", headers=ADMIN).json() if t["name"] == "admin"
    )
    refused = world.client.post(f"/v1/tokens/{admin_id}/revoke", headers=ADMIN)
    assert refused.status_code == 409
    assert refused.json()["field"] == "token_id"
    assert world.client.get("/v1/tokens", headers=ADMIN).status_code == 200


def test_open_reads_let_anonymous_callers_read_but_never_write(database_url: str) -> None:
    upgrade(database_url)
    settings = Settings(db_url=database_url, admin_token=ADMIN_SECRET, open_reads=True)
    with TestClient(create_app(settings, reaper=False)) as client:
        assert client.get("/v1/jobs").status_code == 200
        assert client.get("/v1/jobs", headers={"Authorization": "Bearer tt_bogus"}).status_code == 401
        assert client.post("/v1/sweeps", json=SWEEP).status_code == 401
        assert client.post("/v1/workers", json=WORKER).status_code == 401
        assert client.get("/v1/tokens").status_code == 401


def test_the_openapi_document_declares_the_bearer_scheme(world: World) -> None:
    document = world.client.get("/openapi.json").json()
    schemes = document["components"]["securitySchemes"].values()
    assert [(s["type"], s["scheme"]) for s in schemes] == [("http", "bearer")]
    assert "security" in document["paths"]["/v1/sweeps"]["post"]


def _bearer(made: Any) -> dict[str, str]:
    return {"Authorization": f"Bearer {made.json()['token']}"}


def test_failed_authentications_are_limited_per_address_and_valid_tokens_pass(database_url: str) -> None:
    upgrade(database_url)
    settings = Settings(
        db_url=database_url, admin_token=ADMIN_SECRET, auth_failure_burst=3, auth_failures_per_s=0.001
    )
    app = create_app(settings, reaper=False)
    bogus = {"Authorization": "Bearer tt_a-guess"}
    with TestClient(app, client=("192.0.2.1", 40000)) as client:
        readers = [
            _bearer(client.post("/v1/tokens", json={"role": "reader"}, headers=ADMIN)) for _ in range(5)
        ]
        for reader in readers[:4]:  # valid tokens looked up: no failure is taken
            assert client.get("/v1/jobs", headers=reader).status_code == 200
        for _ in range(3):
            guessed = client.get("/v1/jobs", headers=bogus)
            assert (guessed.status_code, guessed.json()["code"]) == (401, "unauthorized")
        limited = client.get("/v1/jobs", headers=bogus)
        assert limited.status_code == 429
        assert limited.json() == {
            "code": "rate_limited",
            "message": "too many failed authentications from this address; try again later",
            "field": "authorization",
        }
        assert int(limited.headers["retry-after"]) >= 1
        assert client.post("/v1/sweeps", json=SWEEP, headers=bogus).status_code == 429
        assert client.get("/v1/jobs", headers=readers[0]).status_code == 200  # verified before: passes
        # Never looked up before, and still not refused for the guesses made from its address.
        assert client.get("/v1/jobs", headers=readers[4]).status_code == 200
        assert client.get("/v1/jobs", headers=bogus).status_code == 429
        assert client.get("/livez").status_code == 200
    elsewhere = TestClient(app, client=("198.51.100.7", 40000))
    assert elsewhere.get("/v1/jobs", headers=bogus).status_code == 401  # another address: its own budget
    assert elsewhere.get("/v1/jobs", headers=readers[4]).status_code == 200


def _auth_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What the tokens' module said (other loggers may be louder after a server's start in this process)."""
    return [record.getMessage() for record in caplog.records if record.name == "tiletune.service.access.auth"]


def test_an_admin_token_the_database_does_not_know_is_ignored_with_a_warning(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    upgrade(database_url)
    create_app(Settings(db_url=database_url, admin_token=ADMIN_SECRET), reaper=False)  # the first admin
    caplog.set_level(logging.WARNING, logger="tiletune.service.access.auth")

    create_app(Settings(db_url=database_url, admin_token=ADMIN_SECRET), reaper=False)
    assert _auth_warnings(caplog) == []  # a known token: nothing to say

    other = "tt_another-deployments-admin-token-0123456789abcdefg"
    app = create_app(Settings(db_url=database_url, admin_token=SecretStr(other)), reaper=False)
    warnings = _auth_warnings(caplog)
    assert len(warnings) == 1
    assert warnings[0].startswith("TILETUNE_ADMIN_TOKEN is ignored: the database has tokens already")
    assert other not in caplog.text
    with TestClient(app) as client:
        assert client.get("/v1/tokens", headers={"Authorization": f"Bearer {other}"}).status_code == 401
        assert len(client.get("/v1/tokens", headers=ADMIN).json()) == 1

    caplog.clear()
    admin_id = 1
    second = (
        TestClient(app).post("/v1/tokens", json={"role": "admin", "name": "second"}, headers=ADMIN).json()
    )
    revoked = TestClient(app).post(
        f"/v1/tokens/{admin_id}/revoke", headers={"Authorization": f"Bearer {second['token']}"}
    )
    assert revoked.status_code == 200, revoked.text
    create_app(Settings(db_url=database_url, admin_token=ADMIN_SECRET), reaper=False)
    assert _auth_warnings(caplog) == [
        "TILETUNE_ADMIN_TOKEN is ignored: it is the token 'admin' (id 1), revoked"
    ]
    assert ADMIN_SECRET.get_secret_value() not in caplog.text
