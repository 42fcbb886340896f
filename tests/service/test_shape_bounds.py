"""Big shapes of real models are keys at every route; a shape whose tensor cannot exist is refused.

A shape is bounded by the bytes of each tensor of a call (``MAX_TENSOR_BYTES``, counted in
float32), never by the product of all its dims: matmul 4096³ and attention
1×32×4096×4096×128 are looked up, swept and counted as misses; a matmul whose output would
hold 4 TiB is refused at each route with a 422 naming the field, the tensor and its bytes,
and nothing is written. The real app on SQLite and PostgreSQL; no kernel runs and no such
tensor is ever allocated (the sweep's jobs stay queued: no worker leases them).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.credentials import ADMIN, ADMIN_SECRET
from tests.service.conftest import snapshot
from tiletune.client.wire import shape_text
from tiletune.service.app import create_app
from tiletune.service.migrate import upgrade
from tiletune.service.settings import Settings

CHIP = {"name": "cpu/Shape Bound Chip/2c", "kind": "cpu", "local_memory_bytes": 1 << 20}
MATMUL_4096 = {"m": 4096, "n": 4096, "k": 4096, "a_transposed": 0, "b_transposed": 1}
ATTENTION_4096 = {"batch": 1, "heads": 32, "kv_heads": 8, "seq_q": 4096, "seq_kv": 4096, "head_dim": 128}
ATTENTION_4096 |= {"causal": 1, "mask": 0}
BIG = [("matmul", MATMUL_4096), ("fused_attention", ATTENTION_4096)]
#: ``out`` would hold 2^40 float32 elements (4 TiB); ``a`` and ``b`` only 64 MiB each.
MATMUL_TOO_BIG = {"m": 2**20, "n": 2**20, "k": 16}
#: ``q`` (and ``out``) would hold 2^40 float32 elements; ``k`` and ``v`` are small.
ATTENTION_TOO_BIG = {"batch": 64, "heads": 128, "seq_q": 131072, "seq_kv": 1, "head_dim": 1024, "causal": 0}
TOO_BIG = [("matmul", MATMUL_TOO_BIG, "out"), ("fused_attention", ATTENTION_TOO_BIG, "q")]
FOUR_TIB = f"would hold 4.0 TiB ({4 * 2**40} bytes in float32"


@pytest.fixture
def client(database_url: str) -> Iterator[tuple[TestClient, str]]:
    upgrade(database_url)
    settings = Settings(db_url=database_url, admin_token=ADMIN_SECRET, miss_queue_threshold=100)
    with TestClient(create_app(settings, reaper=False), headers=ADMIN) as test_client:
        worker = test_client.post("/v1/workers", json={"name": "w", "chip": CHIP, "backends": ["torch"]})
        assert worker.status_code == 201, worker.text
        yield test_client, database_url


def lookup(app: TestClient, kernel: str, shape: dict[str, int]) -> Any:
    params = {"shape": shape_text(shape), "dtype": "float16", "chip": CHIP["name"]}
    return app.get(f"/v1/configs/{kernel}", params=params)


def sweep(app: TestClient, kernel: str, shape: dict[str, int]) -> Any:
    return app.post("/v1/sweeps", json={"kernel": kernel, "shapes": [shape], "dtypes": ["float16"]})


def report_miss(app: TestClient, kernel: str, shape: dict[str, int]) -> Any:
    entry = {"kernel": kernel, "shape": shape, "dtype": "float16", "chip": CHIP["name"], "match": "default"}
    return app.post("/v1/misses", json={"misses": [{**entry, "count": 1}]})


@pytest.mark.parametrize(("kernel", "shape"), BIG, ids=["matmul", "attention"])
def test_big_shapes_of_real_models_are_looked_up_swept_and_counted(
    client: tuple[TestClient, str], kernel: str, shape: dict[str, int]
) -> None:
    app, _ = client
    found = lookup(app, kernel, shape)
    assert found.status_code == 200, found.text
    assert found.json()["match"] == "default"

    created = sweep(app, kernel, shape)
    assert created.status_code == 201, created.text
    [job] = created.json()["jobs"]
    assert (job["kernel"], job["shape"], job["dtype"], job["state"]) == (kernel, shape, "float16", "queued")

    counted = report_miss(app, kernel, shape)
    assert counted.status_code == 200, counted.text
    assert counted.json()["accepted"] == 1
    [row] = app.get("/v1/misses", params={"kernel": kernel}).json()
    assert (row["shape"], row["count"]) == (shape, 1)


Route = Any
ROUTES = [(lookup, "shape"), (sweep, "shapes[0]"), (report_miss, "misses[0].shape")]


@pytest.mark.parametrize("case", TOO_BIG, ids=["matmul", "attention"])
@pytest.mark.parametrize("route", ROUTES, ids=["lookup", "sweep", "miss"])
def test_a_shape_whose_tensor_exceeds_the_limit_is_refused_at_every_route(
    client: tuple[TestClient, str], route: tuple[Route, str], case: tuple[str, dict[str, int], str]
) -> None:
    app, url = client
    (send, field), (kernel, shape, tensor) = route, case
    before = snapshot(url)
    response = send(app, kernel, shape)
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["field"] == field
    assert f"tensor {tensor} {FOUR_TIB}" in body["message"]
    assert "at most 1.0 TiB per tensor" in body["message"]
    assert snapshot(url) == before


def test_a_sweep_over_the_operators_byte_limit_names_its_biggest_tensor(
    client: tuple[TestClient, str],
) -> None:
    """Attention at seq 65536: every tensor of a call is small, the reference's scores are not."""
    app, url = client
    before = snapshot(url)
    long = {**ATTENTION_4096, "seq_q": 65536, "seq_kv": 65536}
    assert lookup(app, "fused_attention", long).status_code == 200  # a key all the same
    response = sweep(app, "fused_attention", long)
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["field"] == "shapes[0]"
    assert "its biggest tensor, scores, 512.0 GiB (549755813888 bytes)" in body["message"]
    assert "at most 8.0 GiB are allowed (TILETUNE_MAX_SHAPE_BYTES)" in body["message"]
    assert snapshot(url) == before
