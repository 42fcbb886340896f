"""The demand budget and the bounds of miss reports (``tiletune.service.demand.misses`` states the contract).

Runs the real app on SQLite and PostgreSQL (``database_url``) with a manual clock, as
``test_misses`` does; the replicas test runs two apps on one database, as two servers
behind a load balancer would.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.credentials import ADMIN, ADMIN_SECRET
from tiletune.kernels import all_kernels
from tiletune.service.app import create_app
from tiletune.service.demand.misses import MAX_MISS_COUNT
from tiletune.service.migrate import upgrade
from tiletune.service.settings import Settings

from .conftest import ManualClock
from .test_misses import CHIP, SHAPE, THRESHOLD, TRIALS, jobs, listed, miss, register, report

Serve = Callable[..., TestClient]

#: A legal key whose bench holds 24 GiB (add, float32): over the default limit of 8 GiB.
HUGE = {"n": 2**30}


@pytest.fixture
def serve(database_url: str, clock: ManualClock) -> Iterator[Serve]:
    """Starts an app on the test's database (threshold 3, 5 trials, ``overrides``; its reaper loop
    only if ``reaper``); each call is another app on the same database: a restart with other
    settings, or another replica."""
    upgrade(database_url)
    with ExitStack() as stack:

        def start(reaper: bool = False, **overrides: Any) -> TestClient:
            fields: dict[str, Any] = {"miss_queue_threshold": THRESHOLD, "miss_trials": TRIALS, **overrides}
            settings = Settings(db_url=database_url, admin_token=ADMIN_SECRET, **fields)
            return stack.enter_context(
                TestClient(create_app(settings, clock=clock, reaper=reaper), headers=ADMIN)
            )

        yield start


def plan_demand(client: TestClient) -> list[int]:
    """A demand pass of ``client``'s app (what its reaper loop runs)."""
    queued: list[int] = client.app.state.services.misses.plan_demand()  # type: ignore[attr-defined]
    return queued


def job_sizes(client: TestClient, job_ids: list[int]) -> list[int]:
    return [client.get(f"/v1/jobs/{job_id}").json()["shape"]["n"] for job_id in job_ids]


def test_the_budget_queues_the_most_missed_keys_first_and_refills_after_an_hour(
    serve: Serve, clock: ManualClock
) -> None:
    client = serve(miss_queue_threshold=1, demand_jobs_per_chip_hour=3)
    register(client)
    keys = [miss(shape={"n": n}, count=n) for n in range(1, 11)]  # n=10 was missed most
    queued = report(client, *keys)["queued_jobs"]
    assert sorted(job_sizes(client, queued), reverse=True) == [10, 9, 8]
    assert report(client, *keys)["queued_jobs"] == [], "the hour's budget is spent"
    clock.advance(3599)
    assert plan_demand(client) == []
    assert len(jobs(client)) == 3
    clock.advance(2)  # the first three were queued over an hour ago
    refilled = plan_demand(client)
    assert sorted(job_sizes(client, refilled), reverse=True) == [7, 6, 5]
    assert {row["shape"]["n"] for row in listed(client) if row["job_id"] is None} == {1, 2, 3, 4}


def test_the_reaper_loop_queues_a_key_whose_live_job_ended_without_another_report(serve: Serve) -> None:
    client = serve(reaper=True, reap_interval_s=0.05)
    register(client)
    sweep = {"kernel": "add", "shapes": [SHAPE], "chips": [CHIP["name"]], "trials": 4}
    submitted = client.post("/v1/sweeps", json=sweep)
    assert submitted.status_code == 201, submitted.text
    assert report(client, miss(count=THRESHOLD))["queued_jobs"] == [], "a live job covers the key"
    [job] = submitted.json()["jobs"]
    assert client.post(f"/v1/jobs/{job['id']}/cancel").status_code == 200
    deadline = time.monotonic() + 10
    while listed(client)[0]["job_id"] is None and time.monotonic() < deadline:
        time.sleep(0.05)
    demand_job = listed(client)[0]["job_id"]
    assert demand_job is not None
    assert client.get(f"/v1/jobs/{demand_job}").json()["state"] == "queued"


def test_a_budget_of_zero_turns_demand_off(serve: Serve) -> None:
    client = serve(demand_jobs_per_chip_hour=0)
    register(client)
    assert report(client, miss(count=1000))["queued_jobs"] == []
    assert plan_demand(client) == []
    assert jobs(client) == []
    assert listed(client)[0]["count"] == 1000


def test_demand_jobs_keep_to_the_servers_shape_limit(serve: Serve) -> None:
    small, large = {"n": 1024}, {"n": 2**20}
    held = all_kernels()["add"].allocated_bytes(large, "float32")
    limit = int(held) - 1  # the large key's bench is just over it; the small one's far below
    client = serve(max_shape_bytes=limit)
    register(client)
    queued = report(client, miss(shape=large, count=THRESHOLD), miss(shape=small, count=THRESHOLD))
    assert job_sizes(client, queued["queued_jobs"]) == [1024]
    assert {row["shape"]["n"]: row["count"] for row in listed(client)} == {2**20: 3, 1024: 3}
    assert plan_demand(client) == []
    raised = serve(max_shape_bytes=int(held))  # the operator raises the limit
    assert job_sizes(raised, plan_demand(raised)) == [2**20]


def test_a_key_over_the_limit_is_counted_and_never_fails_its_batch(serve: Serve) -> None:
    client = serve()
    register(client)
    for _ in range(THRESHOLD + 1):
        response = client.post("/v1/misses", json={"misses": [miss(shape=HUGE), miss()]})
        assert response.status_code == 200, response.text
    counts = {row["shape_key"]: (row["count"], row["job_id"] is not None) for row in listed(client)}
    assert counts == {"n=1073741824": (THRESHOLD + 1, False), "n=65536": (THRESHOLD + 1, True)}
    assert [job["shape"] for job in jobs(client)] == [{"n": 65536}]


def test_a_keys_count_stops_at_the_largest_the_store_holds(serve: Serve) -> None:
    client = serve(miss_queue_threshold=0)
    many = [miss(count=1_000_000)] * 2200  # 2.2e9 in one batch: over a 32-bit integer
    for _ in range(2):
        assert report(client, *many)["accepted"] == 2200
        assert listed(client)[0]["count"] == MAX_MISS_COUNT
    assert report(client, miss(shape={"n": 8}, count=5))["accepted"] == 1


def test_a_maximal_batch_is_checked_whole_before_it_is_written_in_parts(serve: Serve) -> None:
    client = serve(miss_queue_threshold=0)
    keys = [miss(shape={"n": n}) for n in range(1, 10_001)]
    refused = client.post("/v1/misses", json={"misses": [*keys[:-1], miss(shape={"n": 0})]})
    assert refused.status_code == 422, refused.text
    assert refused.json()["field"] == "misses[9999].shape.n"
    assert listed(client) == []
    assert report(client, *keys)["accepted"] == 10_000
    counted = client.app.state.services.misses.misses(limit=20_000)  # type: ignore[attr-defined]
    assert len(counted) == 10_000
    assert {row.count for row in counted} == {1}


def test_replicas_sharing_a_store_queue_at_most_the_budget_together(serve: Serve) -> None:
    budget = 5
    replicas = [serve(miss_queue_threshold=2, demand_jobs_per_chip_hour=budget) for _ in range(2)]
    register(replicas[0])
    keys = [miss(shape={"n": n}) for n in range(1, 201)]
    assert report(replicas[0], *keys)["queued_jobs"] == []  # one miss each: none eligible yet
    senders = 6
    barrier = threading.Barrier(senders)
    queued: list[int] = []
    failures: list[str] = []

    def send(index: int) -> None:
        replica = replicas[index % 2]
        barrier.wait()
        response = replica.post("/v1/misses", json={"misses": keys})  # every key eligible at once
        if response.status_code != 200:
            failures.append(response.text)
            return
        queued.extend(response.json()["queued_jobs"])
        queued.extend(plan_demand(replica))

    threads = [threading.Thread(target=send, args=(i,)) for i in range(senders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    demand = [job["id"] for job in jobs(replicas[0])]
    assert len(demand) == budget
    assert sorted(queued) == sorted(demand), "each job queued once, by one replica"
    assert plan_demand(replicas[1]) == []
    assert [row["count"] for row in listed(replicas[1], limit=1000)] == [1 + senders] * 200
