"""Bad input, sent in bad faith or by mistake: a 4xx naming the field, and nothing changed.

Each attack is sent to the real app on SQLite and PostgreSQL; every table is read before and
after (:func:`tests.service.conftest.snapshot`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.bundles import SOFTWARE, sealed
from tests.credentials import ADMIN, ADMIN_SECRET
from tests.service.conftest import snapshot
from tiletune.service.app import create_app
from tiletune.service.migrate import upgrade
from tiletune.service.settings import Settings

CHIP = {"name": "cpu/Input Test Chip/2c", "kind": "cpu", "local_memory_bytes": 1 << 20}
ADD = {"tile_size": 4096, "buffer_num": 2, "pipeline_depth": 2}
HUGE = 10**20
JSON = {"Content-Type": "application/json"}


@pytest.fixture
def client(database_url: str) -> Iterator[tuple[TestClient, str]]:
    upgrade(database_url)
    settings = Settings(db_url=database_url, admin_token=ADMIN_SECRET)
    with TestClient(create_app(settings, reaper=False), headers=ADMIN) as test_client:
        worker = test_client.post("/v1/workers", json={"name": "w", "chip": CHIP, "backends": ["torch"]})
        assert worker.status_code == 201
        yield test_client, database_url


def entry(**fields: Any) -> dict[str, Any]:
    return {
        "kernel": "add",
        "kernel_version": 1,
        "shape": {"n": 65536},
        "shape_key": "n=65536",
        "dtype": "float32",
        "chip": CHIP["name"],
        "config": ADD,
        "median_ms": 1.0,
        "promoted_at": datetime.now(UTC).isoformat(),
        "software": SOFTWARE,
        **fields,
    }


def send_raw(client: TestClient, method: str, path: str, document: Any, **kwargs: Any) -> Any:
    """``document`` as JSON that may hold NaN and infinities (as a hostile client can send)."""
    body = json.dumps(document, allow_nan=True)
    return client.request(method, path, content=body, headers=JSON, **kwargs)


def assert_refused(response: Any, field: str) -> None:
    assert 400 <= response.status_code < 500, response.text
    body = response.json()
    assert set(body) == {"code", "message", "field"}
    assert body["field"] is not None
    assert field in body["field"], body


POISON = [
    (entry(software={}), "configs[1].software"),
    (entry(kernel="no_such_kernel"), "configs[1].kernel"),
    (entry(kernel_version=99), "configs[1].kernel_version"),
    (entry(config={"block": -7, "evil_knob": 10**18}), "configs[1].config"),
    (entry(config={**ADD, "tile_size": 3}), "configs[1].config.tile_size"),
    (entry(shape={"n": 65536, "m": 2}), "configs[1].shape"),
    (entry(dtype="float64"), "configs[1].dtype"),
    (entry(median_ms=-1.0), "configs[1].median_ms"),
    (entry(median_ms=0.0), "configs[1].median_ms"),
    (entry(median_ms=1e-9), "configs[1].median_ms"),
    (entry(median_ms=float("-inf")), "configs[1].median_ms"),
    (entry(median_ms=float("nan")), "configs[1].median_ms"),
    (entry(default_ms=float("inf")), "configs[1].default_ms"),
]


@pytest.mark.parametrize(("bad", "field"), POISON)
def test_a_poisoned_import_is_refused_and_changes_nothing(
    client: tuple[TestClient, str], bad: dict[str, Any], field: str
) -> None:
    app, url = client
    assert app.post("/v1/configs/import", json=sealed(entry())).json() == {"changed": 1}
    before = snapshot(url)

    bundle = {"configs": [entry(median_ms=0.5), bad], "checksum": "0" * 64}  # entries are checked first
    response = send_raw(app, "POST", "/v1/configs/import", bundle)

    assert_refused(response, field)
    assert snapshot(url) == before
    exported = app.get("/v1/configs", params={"chip": CHIP["name"]}).json()
    assert [e["median_ms"] for e in exported["configs"]] == [1.0]


def test_an_import_derives_the_key_itself(client: tuple[TestClient, str]) -> None:
    app, _ = client
    assert app.post("/v1/configs/import", json=sealed(entry(shape_key="n=1"))).json() == {"changed": 1}
    found = app.get("/v1/configs/add", params={"shape": "n=65536", "chip": CHIP["name"], "match": "exact"})
    assert found.status_code == 200


MEMORY_BOMBS = [
    {"kernel": "add", "shapes": [{"n": 2**34}]},
    {"kernel": "matmul", "shapes": [{"m": 131072, "n": 131072, "k": 1}]},
    {
        "kernel": "fused_attention",
        "shapes": [{"batch": 1, "heads": 1, "seq_q": 131072, "seq_kv": 131072, "head_dim": 1, "causal": 0}],
    },
]


@pytest.mark.parametrize("sweep", MEMORY_BOMBS, ids=["add", "matmul", "attention"])
def test_a_shape_that_would_not_fit_in_memory_is_refused(client: tuple[TestClient, str], sweep: Any) -> None:
    app, url = client
    before = snapshot(url)
    response = app.post("/v1/sweeps", json=sweep)
    assert_refused(response, "shapes[0]")
    message = response.json()["message"]
    assert "GiB" in message
    assert "its biggest tensor" in message
    assert snapshot(url) == before


UNBOUNDED = [
    ("POST", "/v1/sweeps", {"kernel": "add", "shapes": [{"n": 64}], "seed": -1}, "seed"),
    ("POST", "/v1/sweeps", {"kernel": "add", "shapes": [{"n": 64}], "seed": HUGE}, "seed"),
    ("POST", "/v1/sweeps", {"kernel": "add", "shapes": [{"n": 64}], "patience": HUGE}, "patience"),
    (
        "POST",
        "/v1/sweeps",
        {"kernel": "add", "shapes": [{"n": 64}], "max_time_s": float("inf")},
        "max_time_s",
    ),
    ("POST", "/v1/sweeps", {"kernel": "add", "shapes": [{"n": True}]}, "shapes[0].n"),
    ("POST", "/v1/sweeps", {"kernel": "add", "shapes": [{"n": HUGE}]}, "shapes[0].n"),
    ("POST", "/v1/sweeps", {"kernel": "add", "shapes": [{"n": 64}], "chips": ["a\x00b"]}, "chips[0]"),
    ("POST", "/v1/sweeps", {"kernel": "add", "shapes": [{"n": 64}], "chips": ["evil\u202etxt"]}, "chips[0]"),
    ("POST", "/v1/sweeps", {"kernel": "add", "shapes": [{"n": 64}], "chips": ["x" * 5000]}, "chips[0]"),
    ("POST", "/v1/leases", {"worker_id": HUGE}, "worker_id"),
    (
        "POST",
        "/v1/workers",
        {"name": "w", "chip": {**CHIP, "local_memory_bytes": HUGE}, "backends": ["torch"]},
        "chip.local_memory_bytes",
    ),
    (
        "POST",
        "/v1/workers",
        {"name": "w", "chip": CHIP, "backends": ["torch"], "kernel_versions": {"add": HUGE}},
        "kernel_versions.add",
    ),
    (
        "POST",
        "/v1/workers",
        {"name": "w", "chip": CHIP, "backends": ["torch"], "software": {"torch": "1\x00"}},
        "software.torch",
    ),
    (
        "POST",
        "/v1/misses",
        {
            "misses": [
                {
                    "kernel": "add",
                    "shape": {"n": 64},
                    "dtype": "float32",
                    "chip": CHIP["name"],
                    "match": "default",
                    "count": HUGE,
                }
            ]
        },
        "misses[0].count",
    ),
]


@pytest.mark.parametrize(("method", "path", "document", "field"), UNBOUNDED)
def test_every_input_is_bounded(
    client: tuple[TestClient, str], method: str, path: str, document: Any, field: str
) -> None:
    app, url = client
    before = snapshot(url)
    assert_refused(send_raw(app, method, path, document), field)
    assert snapshot(url) == before


@pytest.mark.parametrize(
    ("path", "field"),
    [("/v1/jobs?offset=100000000000000000000", "offset"), ("/v1/sweeps/100000000000000000000", "sweep_id")],
)
def test_ids_and_offsets_beyond_the_database_are_refused(
    client: tuple[TestClient, str], path: str, field: str
) -> None:
    app, _ = client
    assert_refused(app.get(path), field)


def test_every_error_has_the_error_body(client: tuple[TestClient, str]) -> None:
    app, _ = client
    for response, status, code in [
        (app.get("/no/such/route"), 404, "not_found"),
        (app.delete("/v1/sweeps"), 405, "method_not_allowed"),
        (
            app.post("/v1/sweeps", content=b"\xff\xfe{", headers={"Content-Type": "application/json"}),
            400,
            None,
        ),
        (app.get("/v1/sweeps/12345"), 404, "not_found"),
    ]:
        assert response.status_code == status, response.text
        body = response.json()
        assert set(body) == {"code", "message", "field"}
        assert code is None or body["code"] == code


def test_repeated_shapes_make_one_job(client: tuple[TestClient, str]) -> None:
    app, _ = client
    sweep = app.post("/v1/sweeps", json={"kernel": "add", "shapes": [{"n": 64}, {"n": 64}, {"n": 64}]})
    assert sweep.status_code == 201
    assert len(sweep.json()["jobs"]) == 1


def test_the_body_limit_counts_the_bytes_received_chunked_or_not(database_url: str) -> None:
    upgrade(database_url)
    settings = Settings(db_url=database_url, admin_token=ADMIN_SECRET, max_body_bytes=2000)
    shapes = [{"n": 1024 + i} for i in range(200)]
    body = json.dumps({"kernel": "add", "shapes": shapes}).encode()

    def chunked() -> Iterator[bytes]:
        for start in range(0, len(body), 500):
            yield body[start : start + 500]

    with TestClient(create_app(settings, reaper=False), headers=ADMIN) as app:
        before = snapshot(database_url)
        response = app.post("/v1/sweeps", content=chunked(), headers=JSON)
        assert "content-length" not in response.request.headers
        assert response.status_code == 413
        assert response.json()["code"] == "too_large"
        assert snapshot(database_url) == before
        small = app.post(
            "/v1/sweeps", content=iter([b'{"kernel": "add", ', b'"shapes": [{"n": 64}]}']), headers=JSON
        )
        assert small.status_code == 201, small.text


def test_miss_reports_are_rate_limited_per_token(database_url: str) -> None:
    upgrade(database_url)
    settings = Settings(
        db_url=database_url, admin_token=ADMIN_SECRET, miss_reports_per_s=0.001, miss_report_burst=2
    )
    miss = {"kernel": "add", "shape": {"n": 64}, "dtype": "float32", "chip": CHIP["name"], "match": "default"}
    with TestClient(create_app(settings, reaper=False), headers=ADMIN) as app:
        assert [app.post("/v1/misses", json={"misses": [miss]}).status_code for _ in range(2)] == [200, 200]
        before = snapshot(database_url)
        refused = app.post("/v1/misses", json={"misses": [miss]})
        assert refused.status_code == 429
        assert refused.json()["code"] == "rate_limited"
        assert int(refused.headers["retry-after"]) >= 1
        assert snapshot(database_url) == before


def test_a_lease_token_is_never_part_of_a_path(client: tuple[TestClient, str]) -> None:
    from tiletune.client import calls
    from tiletune.client.wire import LEASE_TOKEN_HEADER, MeasurementWire, TrialOutcome, ValidatedConfig

    app, url = client
    worker = app.post("/v1/workers", json={"name": "w3", "chip": CHIP, "backends": ["torch"]}).json()["id"]
    assert (
        app.post("/v1/sweeps", json={"kernel": "add", "shapes": [{"n": 4096}], "trials": 3}).status_code
        == 201
    )
    token = app.post("/v1/leases", json={"worker_id": worker}).json()["token"]
    before = snapshot(url)
    for verb in ("heartbeat", "ask", "tell", "complete", "release"):  # no route takes it in its path
        assert app.post(f"/v1/leases/{token}/{verb}", json={}).status_code == 404, verb
    assert snapshot(url) == before
    timing = MeasurementWire(median_ms=1.0, p10_ms=1.0, p90_ms=1.0, min_ms=1.0, samples=3)
    for call in (
        calls.heartbeat(token),
        calls.ask(token, 2, [1]),
        calls.tell(token, [TrialOutcome(trial_id=1, error="made up")]),
        calls.complete(token, [ValidatedConfig(config={"tile_size": 64}, measurement=timing)]),
        calls.release(token, "stopping", False),
    ):
        assert token not in call.path
        assert token not in str(call.params)
        assert call.headers == {LEASE_TOKEN_HEADER: token}


def test_a_told_time_that_is_not_a_time_is_refused(client: tuple[TestClient, str]) -> None:
    app, url = client
    worker = app.post("/v1/workers", json={"name": "w2", "chip": CHIP, "backends": ["torch"]}).json()["id"]
    assert (
        app.post("/v1/sweeps", json={"kernel": "add", "shapes": [{"n": 4096}], "trials": 3}).status_code
        == 201
    )
    lease = app.post("/v1/leases", json={"worker_id": worker}).json()
    headers = {**JSON, "X-Lease-Token": lease["token"]}
    task = app.post("/v1/lease/ask", headers=headers).json()["tasks"][0]
    before = snapshot(url)
    for median, field in [(float("nan"), "median_ms"), (float("inf"), "median_ms"), (1e-9, "median_ms")]:
        timing = {"median_ms": median, "p10_ms": 1.0, "p90_ms": 1.0, "min_ms": 1.0, "samples": 3}
        told = {"outcomes": [{"trial_id": task["trial_id"], "measurement": timing}]}
        assert_refused(app.post("/v1/lease/tell", content=json.dumps(told), headers=headers), field)
    huge = {"outcomes": [{"trial_id": HUGE, "error": "made up"}]}
    assert_refused(app.post("/v1/lease/tell", content=json.dumps(huge), headers=headers), "trial_id")
    assert snapshot(url) == before
