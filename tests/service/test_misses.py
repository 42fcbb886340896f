"""Contract suite of miss reporting and demand-driven tuning, and of the bulk export's kernel info.

Runs the real app on SQLite and PostgreSQL (``database_url``) with a manual
clock; the test plays the clients that report misses and the worker that
leases the demand jobs (``tiletune.service.demand.misses`` states the contract).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from datetime import datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.bundles import SOFTWARE, sealed
from tests.credentials import ADMIN, ADMIN_SECRET
from tiletune.kernels import all_kernels
from tiletune.service.app import create_app
from tiletune.service.migrate import upgrade
from tiletune.service.settings import Settings

from .conftest import ManualClock

CHIP = {"name": "cpu/Test Chip (AVX2)/2c", "kind": "cpu", "local_memory_bytes": 1 << 20}
UNKNOWN_CHIP = "npu/Ascend910B2"
THRESHOLD = 3
TRIALS = 5
SHAPE = {"n": 65536}

Serve = Callable[..., TestClient]


@pytest.fixture
def serve(database_url: str, clock: ManualClock) -> Iterator[Serve]:
    """Starts the app on the test's database with settings overridden (threshold 3, 5 trials)."""
    upgrade(database_url)
    with ExitStack() as stack:

        def start(**overrides: Any) -> TestClient:
            fields: dict[str, Any] = {"miss_queue_threshold": THRESHOLD, "miss_trials": TRIALS, **overrides}
            settings = Settings(db_url=database_url, admin_token=ADMIN_SECRET, **fields)
            return stack.enter_context(
                TestClient(create_app(settings, clock=clock, reaper=False), headers=ADMIN)
            )

        yield start


@pytest.fixture
def client(serve: Serve) -> TestClient:
    return serve()


def register(client: TestClient, chip: dict[str, Any] | None = None) -> int:
    body = {"name": "w", "chip": chip or CHIP, "backends": ["torch"], "software": {"torch": "2.13.0"}}
    response = client.post("/v1/workers", json=body)
    assert response.status_code == 201, response.text
    worker_id: int = response.json()["id"]
    return worker_id


def miss(
    kernel: str = "add",
    shape: dict[str, Any] | None = None,
    *,
    dtype: str = "float32",
    chip: str = str(CHIP["name"]),
    match: str = "default",
    count: int = 1,
) -> dict[str, Any]:
    shape = SHAPE if shape is None else shape
    return {"kernel": kernel, "shape": shape, "dtype": dtype, "chip": chip, "match": match, "count": count}


def report(client: TestClient, *entries: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/v1/misses", json={"misses": list(entries)})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def listed(client: TestClient, **params: Any) -> list[dict[str, Any]]:
    response = client.get("/v1/misses", params=params)
    assert response.status_code == 200, response.text
    rows: list[dict[str, Any]] = response.json()
    return rows


def jobs(client: TestClient) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = client.get("/v1/jobs").json()
    return found


def lease(client: TestClient, worker_id: int) -> dict[str, Any] | None:
    response = client.post("/v1/leases", json={"worker_id": worker_id})
    if response.status_code == 204:
        return None
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def test_counts_accumulate_across_batches(serve: Serve, clock: ManualClock) -> None:
    client = serve(miss_queue_threshold=100)
    register(client)
    assert report(client, miss(count=2), miss(match="nearest")) == {"accepted": 2, "queued_jobs": []}
    first_seen = clock.now
    clock.advance(30)
    softmax = {"cols": 64, "rows": 8}  # dims out of spec order: the same key as rows=8,cols=64
    report(client, miss(count=4), miss("softmax", softmax, dtype="float16"))
    rows = listed(client)
    assert [(row["kernel"], row["count"]) for row in rows] == [("add", 7), ("softmax", 1)]
    add = rows[0]
    assert add["shape"] == SHAPE
    assert add["shape_key"] == "n=65536"
    assert add["chip"] == CHIP["name"]
    assert add["job_id"] is None
    assert datetime.fromisoformat(add["first_seen_at"]) == first_seen
    assert datetime.fromisoformat(add["last_seen_at"]) == clock.now
    report(client, miss("softmax", {"rows": 8, "cols": 64}, dtype="float16", count=2))
    assert listed(client, kernel="softmax")[0]["count"] == 3
    assert listed(client, kernel="softmax")[0]["shape_key"] == "rows=8,cols=64"


def test_reaching_the_threshold_queues_one_job_that_a_worker_leases(client: TestClient) -> None:
    worker = register(client)
    assert report(client, miss(), miss(match="nearest"))["queued_jobs"] == []
    queued = report(client, miss())["queued_jobs"]
    assert len(queued) == 1
    job = client.get(f"/v1/jobs/{queued[0]}").json()
    assert (job["kernel"], job["shape"], job["dtype"], job["chip"]) == ("add", SHAPE, "float32", CHIP["name"])
    assert (job["state"], job["trials"], job["backend"]) == ("queued", TRIALS, "*")  # chosen at lease
    assert client.get(f"/v1/sweeps/{job['sweep_id']}").json()["name"] == "demand"
    assert listed(client)[0]["job_id"] == job["id"]

    assert report(client, miss(count=THRESHOLD))["queued_jobs"] == [], "the queued job covers the key"
    leased = lease(client, worker)
    assert leased is not None
    assert leased["job"]["id"] == job["id"]
    assert leased["job"]["backend"] == "torch"  # the worker reports no backends per kernel
    assert client.get(f"/v1/jobs/{job['id']}").json()["backend"] == "torch"
    assert report(client, miss(count=THRESHOLD))["queued_jobs"] == [], "the running job covers the key"
    assert [j["id"] for j in jobs(client)] == [job["id"]]
    assert listed(client)[0]["count"] == 3 * THRESHOLD


def test_a_key_is_queued_once_even_after_its_demand_job_ended(client: TestClient) -> None:
    register(client)
    [job_id] = report(client, miss(count=THRESHOLD))["queued_jobs"]
    assert client.post(f"/v1/jobs/{job_id}/cancel").status_code == 200
    assert report(client, miss(count=THRESHOLD))["queued_jobs"] == []
    assert len(jobs(client)) == 1


def test_a_key_with_a_live_job_of_its_own_is_not_queued(client: TestClient) -> None:
    register(client)
    body = {"kernel": "add", "shapes": [SHAPE], "chips": [CHIP["name"]], "trials": 4}
    assert client.post("/v1/sweeps", json=body).status_code == 201
    assert report(client, miss(count=THRESHOLD))["queued_jobs"] == []
    assert len(jobs(client)) == 1
    assert listed(client)[0]["job_id"] is None


def test_a_key_already_tuned_is_not_queued(client: TestClient) -> None:
    register(client)
    params = {"shape": "n=65536", "chip": CHIP["name"], "match": "default"}
    default = client.get("/v1/configs/add", params=params).json()
    best = {
        "kernel": "add",
        "kernel_version": all_kernels()["add"].version,
        "shape": SHAPE,
        "shape_key": "n=65536",
        "dtype": "float32",
        "chip": CHIP["name"],
        "config": default["config"],
        "median_ms": 1.0,
        "promoted_at": "2026-01-01T00:00:00Z",
        "software": SOFTWARE,
    }
    imported = client.post("/v1/configs/import", json=sealed(best))
    assert imported.json() == {"changed": 1}
    assert report(client, miss(count=THRESHOLD, match="nearest"))["queued_jobs"] == []
    assert jobs(client) == []
    other_dtype = report(client, miss(dtype="float16", count=THRESHOLD))["queued_jobs"]
    assert len(other_dtype) == 1, "the same shape in another dtype is another key"


def test_misses_on_an_unknown_chip_are_counted_but_queue_nothing_until_it_registers(
    client: TestClient,
) -> None:
    assert report(client, miss(chip=UNKNOWN_CHIP, count=5)) == {"accepted": 1, "queued_jobs": []}
    assert [(row["chip"], row["count"], row["job_id"]) for row in listed(client)] == [(UNKNOWN_CHIP, 5, None)]
    assert jobs(client) == []
    register(client, {**CHIP, "name": UNKNOWN_CHIP, "kind": "npu"})
    [job_id] = report(client, miss(chip=UNKNOWN_CHIP))["queued_jobs"]
    assert client.get(f"/v1/jobs/{job_id}").json()["chip"] == UNKNOWN_CHIP


def test_threshold_zero_disables_demand(serve: Serve) -> None:
    client = serve(miss_queue_threshold=0)
    register(client)
    assert report(client, miss(count=1000))["queued_jobs"] == []
    assert jobs(client) == []
    assert listed(client)[0]["count"] == 1000


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        (miss("nope"), "misses[1].kernel"),
        (miss(shape={"n": 0}), "misses[1].shape.n"),
        (miss(shape={"n": "many"}), "misses[1].shape.n"),
        (miss(shape={"m": 8}), "misses[1].shape"),
        (miss(dtype="int3"), "misses[1].dtype"),
        (miss(match="exact"), "misses[1].match"),
        (miss(count=0), "misses[1].count"),
    ],
)
def test_a_bad_entry_fails_the_whole_batch(client: TestClient, bad: dict[str, Any], field: str) -> None:
    register(client)
    response = client.post("/v1/misses", json={"misses": [miss(count=THRESHOLD), bad]})
    assert response.status_code == 422, response.text
    assert response.json()["code"] == "invalid"
    assert response.json()["field"] == field
    assert listed(client) == []
    assert jobs(client) == []


def test_an_empty_batch_is_refused(client: TestClient) -> None:
    response = client.post("/v1/misses", json={"misses": []})
    assert response.status_code == 422
    assert response.json()["field"] == "misses"


def test_listing_is_highest_count_first_and_filters(serve: Serve, clock: ManualClock) -> None:
    client = serve(miss_queue_threshold=0)
    report(client, miss(shape={"n": 1}, count=1), miss(shape={"n": 2}, count=5))
    clock.advance(1)
    report(client, miss(shape={"n": 3}, count=3), miss(shape={"n": 4}, count=1))
    report(client, miss("rms_norm", {"rows": 4, "cols": 32}, chip=UNKNOWN_CHIP, count=2))
    assert [row["shape_key"] for row in listed(client)] == [
        "n=2",
        "n=3",
        "rows=4,cols=32",
        "n=4",  # ties: the most recently reported first
        "n=1",
    ]
    assert [row["shape_key"] for row in listed(client, kernel="add", limit=2)] == ["n=2", "n=3"]
    assert [row["kernel"] for row in listed(client, chip=UNKNOWN_CHIP)] == ["rms_norm"]
    unknown = client.get("/v1/misses", params={"kernel": "nope"})
    assert (unknown.status_code, unknown.json()["field"]) == (422, "kernel")
    assert client.get("/v1/misses", params={"limit": 0}).status_code == 422


def test_concurrent_batches_lose_no_count_and_queue_one_job_per_key(serve: Serve) -> None:
    client = serve(miss_queue_threshold=2)
    register(client)
    other = miss(shape={"n": 4096})
    senders = 4
    barrier = threading.Barrier(senders)
    queued: list[int] = []
    failures: list[str] = []

    def send(index: int) -> None:
        barrier.wait()
        batch = [miss(), other] if index % 2 else [other, miss()]
        response = client.post("/v1/misses", json={"misses": batch})
        if response.status_code != 200:
            failures.append(response.text)
            return
        queued.extend(response.json()["queued_jobs"])

    threads = [threading.Thread(target=send, args=(i,)) for i in range(senders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert [row["count"] for row in listed(client)] == [senders, senders]
    assert len(queued) == 2
    assert sorted(queued) == sorted(job["id"] for job in jobs(client))


def test_the_export_bundle_carries_the_kernels_info(client: TestClient) -> None:
    register(client)
    bundle = client.get("/v1/configs", params={"chip": CHIP["name"]}).json()
    assert bundle["chip"] == CHIP["name"]
    assert bundle["configs"] == []
    kernels = {info["name"]: info for info in bundle["kernels"]}
    assert set(kernels) == set(all_kernels())
    attention = kernels["fused_attention"]
    assert attention["dims"] == [
        "batch",
        "heads",
        "kv_heads",
        "seq_q",
        "seq_kv",
        "head_dim",
        "causal",
        "mask",
    ]
    assert attention["categorical"] == ["causal", "mask"]
    assert attention["dim_defaults"] == {"kv_heads": "heads", "mask": 0}
    spec = all_kernels()["fused_attention"]
    assert attention["version"] == spec.version
    assert attention["knobs"] == [knob.name for knob in spec.knobs]
    assert kernels["add"]["categorical"] == []
    one = client.get("/v1/configs", params={"chip": CHIP["name"], "kernel": "softmax"}).json()
    assert [info["name"] for info in one["kernels"]] == ["softmax"]
    assert client.get("/v1/configs", params={"chip": CHIP["name"], "kernel": "nope"}).json()["kernels"] == []
