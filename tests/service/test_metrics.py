"""``/metrics``: the service's Prometheus metrics, through the real app, on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from tests.credentials import ADMIN, ADMIN_SECRET
from tiletune.service.app import create_app
from tiletune.service.migrate import upgrade
from tiletune.service.settings import Settings

from .conftest import ManualClock
from .test_protocol import CHIP, LEASE_S, ask, lease, register, submit, tell, work_job

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture
def client(database_url: str, clock: ManualClock) -> Iterator[TestClient]:
    upgrade(database_url)
    settings = Settings(db_url=database_url, lease_s=LEASE_S, admin_token=ADMIN_SECRET)
    with TestClient(create_app(settings, clock=clock, reaper=False), headers=ADMIN) as test_client:
        yield test_client


def scrape(client: TestClient) -> Samples:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def test_a_tuned_job_shows_in_the_metrics(client: TestClient, clock: ManualClock) -> None:
    register(client)
    job_id = submit(client, trials=6)["jobs"][0]["id"]
    clock.advance(3.0)
    leased = lease(client, 1)
    assert leased is not None
    job = work_job(client, leased["token"])
    found = {"shape": "n=65536", "chip": CHIP["name"], "match": "exact"}
    assert client.get("/v1/configs/add", params=found).status_code == 200
    missing = {"shape": "n=1024", "chip": CHIP["name"], "match": "nearest"}
    assert client.get("/v1/configs/add", params=missing).status_code == 200
    assert client.get(f"/v1/jobs/{job_id}").status_code == 200
    samples = scrape(client)

    assert samples[("tiletune_trials_total", (("outcome", "measured"),))] == job["progress"]["completed"] == 6
    assert samples[("tiletune_jobs", (("state", "done"),))] == 1
    assert samples[("tiletune_best_configs", ())] == 1
    assert samples[("tiletune_workers_online", ())] == 1
    assert samples[("tiletune_lookups_total", (("answer", "exact"),))] == 1
    assert samples[("tiletune_lookups_total", (("answer", "nearest"),))] == 1
    assert samples[("tiletune_job_queue_wait_seconds_sum", ())] == pytest.approx(3.0)
    assert samples[("tiletune_job_run_seconds_count", ())] == 1
    ask_route = (("method", "POST"), ("route", "/v1/lease/ask"), ("status", "200"))
    assert samples[("tiletune_request_seconds_count", ask_route)] >= 3
    job_route = (("method", "GET"), ("route", "/v1/jobs/{job_id}"), ("status", "200"))
    assert samples[("tiletune_request_seconds_count", job_route)] == 1
    labels = " ".join(value for _, pairs in samples for _, value in pairs)
    assert "n=" not in labels, "no shape in any label"
    assert leased["token"] not in labels, "no lease token in any label"
    assert "tile_size" not in labels, "no config in any label"


def test_expired_leases_and_requeued_jobs_are_counted(client: TestClient, clock: ManualClock) -> None:
    register(client)
    submit(client, trials=6)
    leased = lease(client, 1)
    assert leased is not None
    tell(client, leased["token"], ask(client, leased["token"], 2)["tasks"])
    clock.advance(LEASE_S + 1)
    assert lease(client, 1) is not None  # leasing reaps first: the job was back in the queue
    samples = scrape(client)
    assert samples[("tiletune_leases_expired_total", ())] == 1
    assert samples[("tiletune_jobs_requeued_total", ())] == 1
    assert samples[("tiletune_trials_total", (("outcome", "measured"),))] == 2
    unknown = client.get("/no/such/route")
    assert unknown.status_code == 404
    assert (
        scrape(client)[
            ("tiletune_request_seconds_count", (("method", "GET"), ("route", "unmatched"), ("status", "404")))
        ]
        == 1
    )
