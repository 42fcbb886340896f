"""The misses page: what a reader and a submitter see, and the button whose sweep a worker runs.

The browser tests use the session's fleet, whose clients missed variants 11–13 of the replay
kernel (counts 1, 2, 3) with demand tuning off: the page's button is what queues them. The
fleet's tests queue nothing; the button's test, which has a worker tune what it queued, runs on
a server of its own set up the same way (:func:`own_fleet`), so the session's fleet holds what
the other pages' tests expect. The in-process tests check the rules
of queueing (:func:`tiletune.service.demand.selected_misses.queue_selected` through ``POST /misses/queue``) on
a store of their own.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from playwright.sync_api import Browser, Page

from tests.credentials import ADMIN, ADMIN_SECRET, ADMIN_TOKEN
from tests.service.processes import stop
from tiletune.service.app import create_app
from tiletune.service.dashboard.session import COOKIE, csrf_token
from tiletune.service.migrate import upgrade
from tiletune.service.models import MissRow
from tiletune.service.settings import Settings

from .browser import Watched, screenshot, watched_page
from .conftest import MISSED_VARIANTS, REPLAY_CHIP, REPLAY_KERNEL, Fleet, serving

#: Trials of the jobs the browser test queues (few: a replay worker runs them in seconds).
TRIALS = 6
JOBS_TIMEOUT_S = 240.0


def fleet_misses(fleet: Fleet) -> dict[int, dict[str, Any]]:
    """The fleet's misses of the replay kernel by variant (the API's view, for the miss ids)."""
    with fleet.http("reader") as http:
        listed = http.get("/v1/misses", params={"kernel": REPLAY_KERNEL, "chip": REPLAY_CHIP}).json()
    return {miss["shape"]["variant"]: miss for miss in listed}


def miss_rows(page: Page) -> dict[str, dict[str, str]]:
    """The misses table as shown: shape -> {column title: cell text}, plus its miss id."""
    titles = [title.strip(" ▲▼") for title in page.locator("#table-misses thead th").all_inner_texts()]
    found = {}
    for row in page.locator("#table-misses tbody tr[data-miss]").all():
        cells = dict(zip(titles, (text.strip() for text in row.locator("td").all_inner_texts()), strict=True))
        cells["id"] = row.get_attribute("data-miss") or ""
        found[cells["Shape"]] = cells
    return found


def job_count(fleet: Fleet) -> int:
    with fleet.http() as http:
        return len(http.get("/v1/jobs", params={"limit": 1000}).json())


@contextmanager
def cookie_client(fleet: Fleet, role: str, **headers: str) -> Iterator[httpx.Client]:
    """A client signed in with ``role``'s token through the sign-in form: it holds a session cookie."""
    with httpx.Client(base_url=fleet.url, headers=headers, timeout=30) as client:
        signed_in = client.post("/signin", data={"token": fleet.tokens[role], "next": "/"})
        assert signed_in.status_code == 303, signed_in.text
        yield client


def csrf_of(client: httpx.Client) -> str:
    """The CSRF token of a signed-in client's session (what its pages' forms carry)."""
    return csrf_token(client.cookies[COOKIE])


def miss_ids(page: Page) -> dict[str, str]:
    """Shape -> miss id of each row."""
    return {shape: cells["id"] for shape, cells in miss_rows(page).items()}


def test_a_reader_sees_the_misses_and_counts_but_no_button(fleet: Fleet, browser: Browser) -> None:
    misses = fleet_misses(fleet)
    assert sorted(misses) == list(MISSED_VARIANTS)
    with watched_page(browser, fleet.url, fleet.tokens["reader"]) as watched:
        page = watched.goto("/misses")
        shown = miss_rows(page)
        for variant in MISSED_VARIANTS:
            cells = shown[misses[variant]["shape_key"]]
            assert cells["Count"] == str(variant - 10)
            assert cells["Chip"] == REPLAY_CHIP
            assert cells["Last answer"] == "nearest"
        counts = [int(cells["Count"]) for cells in shown.values()]
        assert counts == sorted(counts, reverse=True)
        assert page.locator("input[name=miss]").count() == 0
        assert page.locator("#queue-misses").count() == 0
        assert "Queue a sweep" not in page.content()
        watched.assert_clean()
        # the page's CSRF token is its session's, and the cookie holds a session id, not the token
        csrf = page.locator("form[action='/signout'] input[name=csrf]").get_attribute("value")
        cookie = {c["name"]: c for c in page.context.cookies()}[COOKIE]
        assert cookie["value"] != fleet.tokens["reader"]
        assert (cookie["httpOnly"], cookie["sameSite"]) == (True, "Strict")
        assert csrf == csrf_token(cookie["value"])
    before = job_count(fleet)
    with cookie_client(fleet, "reader") as http:
        listed = http.get("/misses", params={"format": "json", "kernel": REPLAY_KERNEL}).json()
        ids = [str(row["id"]) for row in listed]
        assert ids
        # the reader's own (valid) CSRF token: the role still refuses
        refused = http.post("/misses/queue", data={"csrf": csrf_of(http), "miss": ids})
    assert refused.status_code == 403, refused.text
    assert refused.json()["field"] == "authorization"
    assert job_count(fleet) == before


def test_a_forged_or_foreign_post_queues_nothing(fleet: Fleet) -> None:
    with cookie_client(fleet, "submitter") as http:
        listed = http.get("/misses", params={"format": "json", "kernel": REPLAY_KERNEL}).json()
        ids = [str(row["id"]) for row in listed if row["job_id"] is None]
        assert ids
        before = job_count(fleet)
        wrong = http.post("/misses/queue", data={"csrf": "0" * 32, "miss": ids})
        assert wrong.status_code == 403
        assert wrong.json()["field"] == "csrf"
        missing = http.post("/misses/queue", data={"miss": ids})
        assert missing.status_code == 403
        right = csrf_of(http)
        foreign = http.post(
            "/misses/queue",
            data={"csrf": right, "miss": ids},
            headers={"Origin": "https://elsewhere.example"},
        )
        assert foreign.status_code == 403
        assert foreign.json()["field"] == "origin"
        assert job_count(fleet) == before


def assert_one_sweep_of(fleet: Fleet, job_ids: list[int], shapes: list[str]) -> None:
    """The jobs are one ``misses`` sweep's, queued for ``shapes`` on the replay chip with :data:`TRIALS`."""
    with fleet.http() as http:
        jobs = [http.get(f"/v1/jobs/{job_id}").json() for job_id in job_ids]
        sweep = http.get(f"/v1/sweeps/{jobs[0]['sweep_id']}").json()
    assert sorted(job["shape_key"] for job in jobs) == sorted(shapes)
    assert {(job["kernel"], job["chip"], job["trials"], job["state"]) for job in jobs} == {
        (REPLAY_KERNEL, REPLAY_CHIP, TRIALS, "queued")
    }
    assert sweep["name"] == "misses"
    assert sorted(job["id"] for job in sweep["jobs"]) == job_ids


@pytest.fixture(scope="module")
def own_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """A server of this module's own whose clients missed the same keys, nothing tuned yet."""
    with serving(tmp_path_factory.mktemp("misses"), tuned=False) as own:
        yield own


def test_the_button_queues_a_sweep_that_a_worker_runs(own_fleet: Fleet, browser: Browser) -> None:
    fleet = own_fleet
    misses = fleet_misses(fleet)
    chosen = [misses[variant]["shape_key"] for variant in (12, 13)]
    left = misses[11]["shape_key"]
    before = job_count(fleet)
    with watched_page(browser, fleet.url, fleet.tokens["submitter"]) as watched:
        page = watched.goto(f"/misses?kernel={REPLAY_KERNEL}")
        ids = miss_ids(page)
        for shape in chosen:
            page.check(f"tr[data-miss='{ids[shape]}'] input[name=miss]")
        page.fill("#queue-misses input[name=trials]", str(TRIALS))
        with page.expect_navigation(wait_until="networkidle"):
            page.click("#queue-misses button[type=submit]")
        assert re.search(rf"/misses\?kernel={REPLAY_KERNEL}&queued=\d+$", page.url), page.url
        notice = page.locator("#queued-notice")
        assert "with 2 jobs" in notice.inner_text()
        links = notice.locator("a[href^='/jobs/']")
        job_ids = sorted(
            int(href.rsplit("/", 1)[1]) for href in (a.get_attribute("href") or "" for a in links.all())
        )
        assert len(job_ids) == 2
        assert job_count(fleet) == before + 2
        shown = miss_rows(page)
        for shape in chosen:
            assert shown[shape]["Job state"] == "queued"
            assert int(shown[shape]["Job"]) in job_ids
            assert page.locator(f"tr[data-miss='{ids[shape]}'] input[name=miss]").count() == 0
        assert page.locator(f"tr[data-miss='{ids[left]}'] input[name=miss]").count() == 1
        screenshot(page, "misses")
        watched.assert_clean()

        assert_one_sweep_of(fleet, job_ids, chosen)

        # queued once: posting the same misses again (the page's own token) queues nothing more
        with cookie_client(fleet, "submitter") as http:
            form = {"csrf": csrf_of(http), "miss": [ids[s] for s in chosen]}
            again = http.post("/misses/queue", data=form)
        assert again.status_code == 303
        assert again.headers["location"] == "/misses?live=2"
        assert job_count(fleet) == before + 2

        worker = fleet.start_replay_worker("misses", ["--batch", "4"])
        try:
            fleet.wait_for_jobs(dict.fromkeys(job_ids, "done"), timeout_s=JOBS_TIMEOUT_S)
        finally:
            stop(worker)

        assert_tuned_now(watched, ids, chosen, left)
        watched.assert_clean()


def assert_tuned_now(watched: Watched, ids: dict[str, str], tuned: list[str], untouched: str) -> None:
    """The ``tuned`` keys left the untuned list and show their job done and their best time."""
    page = watched.goto(f"/misses?kernel={REPLAY_KERNEL}")
    untuned = miss_rows(page)
    assert untouched in untuned
    for shape in tuned:
        assert shape not in untuned  # tuned on its chip now: not listed among the untuned
    page = watched.goto(f"/misses?kernel={REPLAY_KERNEL}&show=all")
    every = miss_rows(page)
    for shape in tuned:
        assert every[shape]["Job state"] == "done"
        assert every[shape]["Tuned"] != "—"
        link = page.locator(f"tr[data-miss='{ids[shape]}'] td a", has_text=shape)
        assert link.count() == 1  # a tuned key links to its shape page
    assert every[untouched]["Tuned"] == "—"


# -- in-process: the rules of queueing ---------------------------------------------------------

CHIP = {"name": "cpu/Misses Chip/2c", "kind": "cpu", "local_memory_bytes": 1 << 20}
CSRF = csrf_token(ADMIN_TOKEN)


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    """The app on a store of its own with one chip registered, demand tuning off."""
    url = f"sqlite:///{tmp_path / 'misses.db'}"
    upgrade(url)
    settings = Settings(db_url=url, admin_token=ADMIN_SECRET, miss_queue_threshold=0, miss_trials=7)
    with TestClient(create_app(settings, reaper=False), headers=ADMIN) as client:
        body = {"name": "w", "chip": CHIP, "backends": ["torch"], "software": {"torch": "2.13.0"}}
        assert client.post("/v1/workers", json=body).status_code == 201
        yield client


def report(client: TestClient, *sizes: int) -> dict[int, int]:
    """Misses of ``add`` at n = ``sizes`` (count: its position + 1); n -> miss id."""
    entries = [
        {
            "kernel": "add",
            "shape": {"n": n},
            "dtype": "float32",
            "chip": CHIP["name"],
            "match": "default",
            "count": index + 1,
        }
        for index, n in enumerate(sizes)
    ]
    assert client.post("/v1/misses", json={"misses": entries}).status_code == 200
    listed = client.get("/misses", params={"format": "json", "show": "all", "per_page": 500}).json()
    return {int(row["shape"].removeprefix("n=")): row["id"] for row in listed}


def newest_sweep(client: TestClient) -> dict[str, Any]:
    """The newest sweep with its jobs (the listing is newest first; the sweep's own route has its jobs)."""
    newest = client.get("/v1/sweeps").json()[0]
    sweep: dict[str, Any] = client.get(f"/v1/sweeps/{newest['id']}").json()
    return sweep


def queue(client: TestClient, ids: list[Any], **fields: Any) -> httpx.Response:
    response: httpx.Response = client.post(
        "/misses/queue", data={"csrf": CSRF, "miss": [str(i) for i in ids], **fields}, follow_redirects=False
    )
    return response


def test_queueing_makes_one_job_per_chosen_key_with_the_servers_trials(client: TestClient) -> None:
    ids = report(client, 1024, 2048, 3072)
    response = queue(client, [ids[1024], ids[3072]])
    assert response.status_code == 303
    sweep_id = int(response.headers["location"].removeprefix("/misses?queued="))
    sweep = client.get(f"/v1/sweeps/{sweep_id}").json()
    assert sweep["name"] == "misses"
    assert sorted(job["shape_key"] for job in sweep["jobs"]) == ["n=1024", "n=3072"]
    assert {(job["trials"], job["backend"], job["chip"]) for job in sweep["jobs"]} == {
        (7, "*", CHIP["name"])  # no backend: each job's first lease chooses it
    }
    listed = {row["shape"]: row for row in client.get("/misses", params={"format": "json"}).json()}
    assert listed["n=2048"]["job_id"] is None
    assert {listed[s]["job_id"] for s in ("n=1024", "n=3072")} == {job["id"] for job in sweep["jobs"]}
    notice = client.get(response.headers["location"]).text
    for job in sweep["jobs"]:
        assert f'href="/jobs/{job["id"]}"' in notice
    # the already queued key is left alone, the other one queued: one new sweep of one job
    second = queue(client, [ids[1024], ids[2048]], trials="3")
    assert second.status_code == 303
    assert re.fullmatch(r"/misses\?queued=\d+&live=1", second.headers["location"])
    newer = newest_sweep(client)
    assert [(job["shape_key"], job["trials"]) for job in newer["jobs"]] == [("n=2048", 3)]
    # the page's filters come back with the notice
    kept = queue(client, [ids[1024]], kernel="add", show="all")
    assert kept.headers["location"] == "/misses?kernel=add&show=all&live=1"


def test_a_key_whose_job_ended_may_be_queued_again_and_a_stale_version_is_not(client: TestClient) -> None:
    ids = report(client, 1024, 2048)
    first = queue(client, [ids[1024]])
    job_id = newest_sweep(client)["jobs"][0]["id"]
    assert client.post(f"/v1/jobs/{job_id}/cancel").status_code == 200
    again = queue(client, [ids[1024]])
    assert again.headers["location"] != first.headers["location"]
    assert newest_sweep(client)["jobs"][0]["state"] == "queued"
    app: FastAPI = client.app  # type: ignore[assignment]
    with app.state.services.db.write() as session:
        row = session.get(MissRow, ids[2048])
        assert row is not None
        row.kernel_version = 0  # as if the kernel had a new version since
    stale = queue(client, [ids[2048]])
    assert stale.headers["location"] == "/misses?stale=1"


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"miss": []}, "miss"),
        ({"miss": ["one"]}, "miss"),
        ({"miss": ["-3"]}, "miss"),
        ({"miss": ["999999"]}, "miss"),
        ({"miss": [str(n) for n in range(1, 502)]}, "miss"),
        ({"trials": "0"}, "trials"),
        ({"trials": "10001"}, "trials"),
        ({"trials": "many"}, "trials"),
    ],
)
def test_bad_fields_are_a_422_naming_them(client: TestClient, fields: dict[str, Any], field: str) -> None:
    ids = report(client, 1024)
    form = {"csrf": CSRF, "miss": [str(ids[1024])], **fields}
    response = client.post("/misses/queue", data=form, follow_redirects=False)
    assert response.status_code == 422, response.text
    assert response.json()["field"] == field
    assert client.get("/v1/sweeps").json() == []


def test_filters_sorting_and_downloads(client: TestClient) -> None:
    report(client, 1024, 2048, 3072)
    rows = client.get("/misses", params={"format": "json"}).json()
    assert [row["count"] for row in rows] == [3, 2, 1]
    ascending = client.get("/misses", params={"format": "json", "sort": "count"}).json()
    assert [row["count"] for row in ascending] == [1, 2, 3]
    page_two = client.get("/misses", params={"format": "json", "per_page": 2, "page": 2}).json()
    assert [row["count"] for row in page_two] == [1]
    assert client.get("/misses", params={"format": "json", "chip": "cpu/other"}).json() == []
    assert client.get("/misses", params={"format": "json", "kernel": "softmax"}).json() == []
    csv = client.get("/misses", params={"format": "csv"})
    assert csv.text.splitlines()[0].startswith("id,kernel,shape,dtype,chip,count")
    assert len(csv.text.splitlines()) == 4
    assert client.get("/misses", params={"sort": "colour"}).json()["field"] == "sort"
    assert client.get("/misses", params={"kernel": "nope"}).json()["field"] == "kernel"
    page = client.get("/misses", params={"per_page": 2}).text
    assert "3 rows · page 1 of 2" in page
