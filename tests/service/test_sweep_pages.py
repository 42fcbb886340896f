"""``GET /v1/sweeps`` is paginated: bounded pages, a cursor, and jobs counted rather than embedded.

The real app on SQLite and PostgreSQL. A page holds at most ``limit`` sweeps, newest first;
``before=<the last id>`` walks every sweep exactly once; a listed sweep carries its jobs'
counts (by state and in all) and an empty ``jobs``, so a page stays small however many jobs
its sweeps hold, while ``GET /v1/sweeps/{id}`` keeps listing them. Items still parse as the
``SweepPublic`` older clients read the list as.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.credentials import ADMIN, ADMIN_SECRET
from tests.service.conftest import snapshot
from tiletune.client import calls
from tiletune.client.wire import SWEEPS_PAGE_DEFAULT, SWEEPS_PAGE_MAX, SweepPublic
from tiletune.service.app import create_app
from tiletune.service.migrate import upgrade
from tiletune.service.settings import Settings

SWEEPS = 23
BIG_SWEEP_JOBS = 300


@pytest.fixture
def client(database_url: str) -> Iterator[tuple[TestClient, str]]:
    upgrade(database_url)
    settings = Settings(db_url=database_url, admin_token=ADMIN_SECRET)
    with TestClient(create_app(settings, reaper=False), headers=ADMIN) as test_client:
        yield test_client, database_url


#: The next shape a sweep of these tests asks for: each sweep's keys are its own (a key has one
#: live job at most, so a sweep of keys another one holds would be born skipped).
_next_n = itertools.count(64)


def submit(app: TestClient, jobs: int, name: str) -> int:
    shapes = [{"n": next(_next_n)} for _ in range(jobs)]
    response = app.post("/v1/sweeps", json={"name": name, "kernel": "add", "shapes": shapes})
    assert response.status_code == 201, response.text
    sweep_id: int = response.json()["id"]
    return sweep_id


def page(app: TestClient, **params: Any) -> list[dict[str, Any]]:
    response = app.get("/v1/sweeps", params=params)
    assert response.status_code == 200, response.text
    items: list[dict[str, Any]] = response.json()
    return items


def test_the_cursor_walks_every_sweep_once_newest_first(client: tuple[TestClient, str]) -> None:
    app, _ = client
    submitted = [submit(app, 1 + index % 3, f"sweep {index}") for index in range(SWEEPS)]
    walked: list[int] = []
    before: int | None = None
    for _ in range(SWEEPS // 5 + 1):  # a cursor that never ends would hold more pages than this
        items = page(app, limit=5, **({"before": before} if before is not None else {}))
        assert len(items) <= 5
        walked += [item["id"] for item in items]
        if len(items) < 5:
            break
        before = items[-1]["id"]
    assert walked == sorted(submitted, reverse=True)
    assert [item["id"] for item in page(app)] == walked[:SWEEPS_PAGE_DEFAULT]


def test_a_listed_sweep_counts_its_jobs_and_does_not_embed_them(client: tuple[TestClient, str]) -> None:
    app, _ = client
    big = submit(app, BIG_SWEEP_JOBS, "big")
    small = submit(app, 2, "small")
    app.post(f"/v1/sweeps/{small}/cancel").raise_for_status()

    response = app.get("/v1/sweeps", params={"limit": 10})
    assert len(response.content) < 2_000, "a page's size does not grow with its sweeps' jobs"
    listed = {item["id"]: item for item in response.json()}
    assert listed[big]["jobs"] == []
    assert (listed[big]["job_count"], listed[big]["counts"]) == (BIG_SWEEP_JOBS, {"queued": BIG_SWEEP_JOBS})
    assert (listed[big]["state"], listed[big]["name"], listed[big]["kernels"]) == ("running", "big", ["add"])
    assert (listed[small]["job_count"], listed[small]["counts"]) == (2, {"cancelled": 2})
    assert listed[small]["state"] == "finished"
    for item in listed.values():
        SweepPublic.model_validate(item)  # an older client's reading of the list still parses

    shown = app.get(f"/v1/sweeps/{big}").json()
    assert len(shown["jobs"]) == BIG_SWEEP_JOBS
    assert shown["counts"] == listed[big]["counts"]

    decoded = calls.sweeps(limit=10).decode(response)  # the client's own call reads the page
    assert [(s.id, s.job_count) for s in decoded] == [(small, 2), (big, BIG_SWEEP_JOBS)]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": SWEEPS_PAGE_MAX + 1}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"before": 0}, "before"),
        ({"before": -3}, "before"),
        ({"before": 10**20}, "before"),
        ({"before": "newest"}, "before"),
    ],
)
def test_a_bad_limit_or_cursor_is_refused_naming_it(
    client: tuple[TestClient, str], params: dict[str, Any], field: str
) -> None:
    app, url = client
    submit(app, 1, "one")
    before = snapshot(url)
    response = app.get("/v1/sweeps", params=params)
    assert response.status_code == 422, response.text
    assert response.json()["field"] == field
    assert snapshot(url) == before


def test_the_largest_page_is_accepted(client: tuple[TestClient, str]) -> None:
    app, _ = client
    only = submit(app, 1, "one")
    assert [item["id"] for item in page(app, limit=SWEEPS_PAGE_MAX, before=only + 1)] == [only]
    assert page(app, before=only) == []
