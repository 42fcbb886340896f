"""The jobs list and the job page: in process on a store filled by SQL, and in a real browser.

In process (:func:`store`): one job of many trials written with core inserts, so the page's
figures, tables, downloads and live fragment are checked against numbers the test chose;
the pure rules (the knobs' influence, the ETA) get their own cases.

In the browser, against the session's filled server (:mod:`.conftest`): a replay job's charts
hold the points ``/v1/jobs/{id}/trials`` holds; a job tuned while the page is open updates
the page without a reload until it is done and polling stops; the list's filters and its CSV.
"""

from __future__ import annotations

import csv
import io
import json
import math
import random
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from playwright.sync_api import Browser, Page
from sqlalchemy import create_engine, insert, update

from tests.credentials import ADMIN, ADMIN_SECRET
from tests.service.processes import stop
from tiletune.service.app import create_app
from tiletune.service.dashboard.job_charts import eta_seconds, format_duration, influences
from tiletune.service.migrate import upgrade
from tiletune.service.models import ChipRow, JobRow, SweepRow, TrialRow
from tiletune.service.settings import Settings

from .browser import chart_points, screenshot, watched_page
from .conftest import REPLAY_CHIP, REPLAY_KERNEL, Fleet, serving

START = datetime(2026, 11, 30, 12, 0, 0)
KNOBS = {"block_x": (16, 32, 64, 128), "block_y": (1, 2, 4, 8), "unroll": (1, 2)}
#: Trial numbers of the filled job that were invalid or failed (every 97th, every 89th).
INVALID_EVERY, FAILED_EVERY = 97, 89


def knob_time_ms(config: dict[str, int], noise: float) -> float:
    """The filled job's time: block_x matters most, then block_y, unroll barely."""
    return (
        (1.0 + abs(config["block_x"] - 64) / 16)
        * (1.0 + config["block_y"] / 8)
        * (1 + 0.01 * config["unroll"])
        * noise
    )


@dataclass(frozen=True)
class Filled:
    """The in-process app and the filled job's id."""

    client: TestClient
    job_id: int
    url: str


def fill_job(url: str, trials: int, state: str = "done", seed: int = 7) -> int:
    """One job of ``trials`` search trials (measured, some invalid or failed) and 3 validation runs."""
    rng = random.Random(seed)
    engine = create_engine(url)
    with engine.begin() as connection:
        chip_id = connection.execute(
            insert(ChipRow).returning(ChipRow.id),
            {
                "name": "test/chip",
                "kind": "cpu",
                "local_memory_bytes": 1 << 20,
                "max_buffer_num": 8,
                "alignment_bytes": 64,
                "created_at": START,
                "updated_at": START,
            },
        ).scalar_one()
        sweep_id = connection.execute(
            insert(SweepRow).returning(SweepRow.id),
            {
                "name": "filled",
                "kernels": ["filled_kernel"],
                "request": {},
                "owner_token_id": None,
                "created_at": START,
            },
        ).scalar_one()
        default = {"block_x": 16, "block_y": 8, "unroll": 1}
        job_id = connection.execute(
            insert(JobRow).returning(JobRow.id),
            {
                "sweep_id": sweep_id,
                "kernel": "filled_kernel",
                "kernel_version": 1,
                "shape": {"n": 4096},
                "shape_key": "n=4096",
                "dtype": "float32",
                "chip_target": "test/chip",
                "chip_id": chip_id,
                "backend": "cpu",
                "strategy": "tpe",
                "trials": trials if state == "done" else trials * 2,
                "max_time_s": None,
                "patience": None,
                "seed": seed,
                "workers_per_job": 1,
                "validate_top": 3,
                "force": False,
                "state": state,
                "active_leases": 0,
                "failure_reasons": [],
                "default_config": default,
                "completed": 0,
                "invalid": 0,
                "failed": 0,
                "best_ms": None,
                "best_config": None,
                "default_ms": knob_time_ms(default, 1.0),
                "created_at": START,
                "updated_at": START,
                "finished_at": None,
            },
        ).scalar_one()
        rows: list[dict[str, Any]] = []
        for number in range(trials):
            config = {name: rng.choice(values) for name, values in KNOBS.items()}
            told = START + timedelta(seconds=2 * number)
            row: dict[str, Any] = {
                "job_id": job_id,
                "number": number,
                "lease_id": None,
                "phase": "search",
                "config": config,
                "state": "measured",
                "median_ms": None,
                "p10_ms": None,
                "p90_ms": None,
                "min_ms": None,
                "samples": None,
                "pruned": False,
                "reason": None,
                "asked_at": told - timedelta(seconds=1),
                "told_at": told,
            }
            if number % INVALID_EVERY == 5:
                row |= {"state": "invalid", "reason": f"too much local memory (trial {number})"}
            elif number % FAILED_EVERY == 7:
                row |= {"state": "failed", "reason": f"launch failed (trial {number})"}
            else:
                median = knob_time_ms(config, rng.uniform(0.95, 1.05))
                row |= {"median_ms": median, "p10_ms": median * 0.98, "p90_ms": median * 1.03, "samples": 20}
            rows.append(row)
        connection.execute(insert(TrialRow), rows)
        measured = sorted((r for r in rows if r["state"] == "measured"), key=lambda r: r["median_ms"])
        validation = [
            {
                **r,
                "number": None,
                "phase": "validate",
                "state": "validated",
                "median_ms": r["median_ms"] * 1.01,
                "samples": 50,
                "told_at": START + timedelta(seconds=2 * trials + 5),
            }
            for r in measured[:3]
        ]
        connection.execute(insert(TrialRow), validation)
        counts = {s: sum(r["state"] == s for r in rows) for s in ("measured", "invalid", "failed")}
        connection.execute(
            update(JobRow)
            .where(JobRow.id == job_id)
            .values(
                completed=counts["measured"],
                invalid=counts["invalid"],
                failed=counts["failed"],
                best_ms=measured[0]["median_ms"],
                best_config=measured[0]["config"],
            )
        )
    engine.dispose()
    return int(job_id)


def open_store(folder: Path, trials: int, state: str = "done") -> tuple[TestClient, int, str]:
    """A migrated SQLite store in ``folder`` with one filled job; the app in process (not started)."""
    url = f"sqlite:///{folder / 'tiletune.db'}"
    upgrade(url)
    job_id = fill_job(url, trials, state)
    app = create_app(Settings(db_url=url, admin_token=ADMIN_SECRET), reaper=False)
    return TestClient(app, headers=ADMIN), job_id, url


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Filled]:
    """The app in process on a store holding one done job of 600 trials."""
    client, job_id, url = open_store(tmp_path, 600)
    with client:
        yield Filled(client, job_id, url)


def figures_of(html: str) -> dict[str, dict[str, Any]]:
    """The figure JSON scripts of a page, by chart id."""
    found = re.findall(r'<script type="application/json" id="([\w-]+)-figure">(.*?)</script>', html, re.S)
    return {chart: json.loads(text) for chart, text in found}


def trace(fig: dict[str, Any], name: str) -> dict[str, Any]:
    """The trace called ``name``."""
    return next(t for t in fig["data"] if t.get("name") == name)


def running_min(values: list[float]) -> list[float]:
    """The best so far of each prefix."""
    out, low = [], math.inf
    for value in values:
        low = min(low, value)
        out.append(low)
    return out


# -- pure rules ---------------------------------------------------------------------------------


def test_influence_is_the_share_of_log_time_variance_a_knob_explains() -> None:
    configs = [{"a": a, "b": b, "fixed": 1} for a in (1, 2) for b in (1, 2, 3)]
    times = [10.0 if c["a"] == 1 else 40.0 for c in configs]
    shares = influences(configs, times)
    assert set(shares) == {"a", "b"}, "a knob with one value explains nothing and is left out"
    assert shares["a"] == pytest.approx(1.0)
    assert shares["b"] == pytest.approx(0.0)
    replicated = [{"a": a, "b": b} for a in (1, 2) for b in (1, 2, 3) for _ in range(4)]
    wobble = [1.0, 1.02, 0.98, 1.01] * 6
    mixed = influences(
        replicated, [c["a"] * 10.0 * (1 + 0.3 * c["b"]) * w for c, w in zip(replicated, wobble, strict=True)]
    )
    assert mixed["a"] > mixed["b"] > 0
    assert mixed["a"] + mixed["b"] <= 1 + 1e-9
    unique = [{"id": n, "a": n % 2} for n in range(10)]
    spread = influences(unique, [10.0 + n for n in range(10)])
    assert spread["id"] == 0.0, "a knob with a value per trial explains nothing by having many values"
    assert influences(configs, [5.0] * len(configs)) == {"a": 0.0, "b": 0.0}


def test_eta_follows_the_pace_of_the_newest_tells() -> None:
    told = [START + timedelta(seconds=3 * n) for n in range(10)]
    assert eta_seconds(told, done=10, budget=40) == pytest.approx(30 * 3)
    assert eta_seconds(told[:1], done=1, budget=40) is None
    assert eta_seconds([START, START], done=2, budget=40) is None
    assert eta_seconds(told, done=40, budget=40) == 0
    slow_then_fast = [START + timedelta(seconds=100 * n) for n in range(5)]
    slow_then_fast += [slow_then_fast[-1] + timedelta(seconds=n) for n in range(1, 60)]
    assert eta_seconds(slow_then_fast, done=64, budget=74) == pytest.approx(10)
    assert format_duration(3725) == "1 h 02 min"
    assert format_duration(185) == "3 min 05 s"
    assert format_duration(None) is None


# -- in process -----------------------------------------------------------------------------------


def test_the_job_page_draws_every_measured_trial_of_the_store(store: Filled) -> None:
    trials = store.client.get(f"/v1/jobs/{store.job_id}/trials").json()
    measured = sorted(
        (t for t in trials if t["phase"] == "search" and t["state"] == "measured"), key=lambda t: t["number"]
    )
    page = store.client.get(f"/jobs/{store.job_id}")
    assert page.status_code == 200, page.text
    figs = figures_of(page.text)
    assert set(figs) == {"chart-best", "chart-trials", "chart-heatmap", "chart-knobs"}
    points = trace(figs["chart-trials"], "measured")
    assert points["x"] == [t["number"] for t in measured]
    assert points["y"] == [t["median_ms"] for t in measured]
    assert figs["chart-trials"]["layout"]["yaxis"]["type"] == "log"
    best = trace(figs["chart-best"], "best so far")
    assert best["y"] == running_min([t["median_ms"] for t in measured])
    assert best["line"]["shape"] == "hv"
    job = store.client.get(f"/v1/jobs/{store.job_id}").json()
    assert trace(figs["chart-best"], "default")["y"] == [job["progress"]["default_ms"]] * 2
    heat = figs["chart-heatmap"]["data"][0]
    assert (heat["x"], heat["y"]) == (["16", "32", "64", "128"], ["1", "2", "4", "8"]), (
        "the two knobs that matter"
    )
    assert figs["chart-heatmap"]["layout"]["xaxis"]["title"]["text"].startswith("block_x")
    cell = [t["median_ms"] for t in measured if t["config"]["block_x"] == 32 and t["config"]["block_y"] == 4]
    sorted_cell = sorted(cell)
    middle = len(cell) // 2
    expected = sorted_cell[middle] if len(cell) % 2 else (sorted_cell[middle - 1] + sorted_cell[middle]) / 2
    assert heat["z"][2][1] == pytest.approx(expected)
    knobs = figs["chart-knobs"]["data"][0]
    assert [d["label"] for d in knobs["dimensions"]] == ["block_x", "block_y", "unroll", "log10 ms"]
    assert len(knobs["line"]["color"]) == len(measured)
    assert 'id="job-live"' in page.text
    assert "hx-trigger" not in page.text, "a done job does not poll"


def test_the_job_page_lists_failures_and_validation_and_downloads_them(store: Filled) -> None:
    trials = store.client.get(f"/v1/jobs/{store.job_id}/trials").json()
    bad = [t for t in trials if t["state"] in ("invalid", "failed")]
    answer = store.client.get(f"/jobs/{store.job_id}", params={"format": "csv", "table": "failures"})
    assert answer.status_code == 200
    rows = list(csv.DictReader(io.StringIO(answer.text)))
    assert [(int(r["number"]), r["state"], r["reason"]) for r in rows] == [
        (t["number"], t["state"], t["reason"]) for t in bad
    ]
    validation = store.client.get(
        f"/jobs/{store.job_id}", params={"format": "json", "table": "validation"}
    ).json()
    expected = sorted((t for t in trials if t["phase"] == "validate"), key=lambda t: t["median_ms"])
    assert [v["median_ms"] for v in validation] == [t["median_ms"] for t in expected]
    assert {"config", "median_ms", "p10_ms", "p90_ms", "samples"} <= set(validation[0])
    page = store.client.get(f"/jobs/{store.job_id}").text
    for trial in bad:
        assert trial["reason"] in page
    bogus = store.client.get(f"/jobs/{store.job_id}", params={"format": "csv", "table": "nope"})
    assert bogus.status_code == 422
    assert "table" in bogus.text
    assert store.client.get("/jobs/999999").status_code == 404
    assert store.client.get("/jobs/999999/live").status_code == 404


def test_a_running_jobs_fragment_polls_and_links_to_the_page(tmp_path: Path) -> None:
    client, job_id, _ = open_store(tmp_path, 50, state="running")
    with client:
        fragment = client.get(f"/jobs/{job_id}/live")
        assert fragment.status_code == 200
        assert fragment.text.lstrip().startswith('<div id="job-live"') or 'id="job-live"' in fragment.text
        polled = re.search(
            r'hx-get="(/jobs/\d+/live\?seen=[^"]+)" hx-trigger="every 2s" hx-swap="outerHTML"', fragment.text
        )
        assert polled is not None, fragment.text[:300]
        unchanged = client.get(polled.group(1).replace("&amp;", "&"))
        assert unchanged.status_code == 204  # nothing moved since: nothing to swap
        assert unchanged.content == b""
        assert client.get(f"/jobs/{job_id}/live", params={"seen": "0.running.0"}).status_code == 200
        assert "<html" not in fragment.text
        assert f'href="/jobs/{job_id}?format=csv&amp;table=failures"' in fragment.text
        assert "ETA" in fragment.text
        assert set(figures_of(fragment.text)) == {
            "chart-best",
            "chart-trials",
            "chart-heatmap",
            "chart-knobs",
        }


def test_the_jobs_list_filters_in_the_url_and_refuses_an_unknown_state(store: Filled) -> None:
    listed = store.client.get("/jobs", params={"state": "done", "format": "json"}).json()
    assert [row["id"] for row in listed] == [str(store.job_id)]
    assert listed[0]["trials"] == "600/600"
    assert store.client.get("/jobs", params={"state": "running", "format": "json"}).json() == []
    assert store.client.get("/jobs", params={"chip": "test/chip", "format": "json"}).json() == listed
    assert store.client.get("/jobs", params={"kernel": "other", "format": "json"}).json() == []
    sweep_id = store.client.get(f"/v1/jobs/{store.job_id}").json()["sweep_id"]
    assert store.client.get("/jobs", params={"sweep": sweep_id, "format": "json"}).json() == listed
    assert store.client.get("/jobs", params={"sweep": sweep_id + 1, "format": "json"}).json() == []
    page = store.client.get("/jobs", params={"state": "done", "kernel": "filled_kernel"})
    assert page.status_code == 200
    assert f'href="/jobs/{store.job_id}"' in page.text
    assert '<option value="done" selected>' in page.text
    refused = store.client.get("/jobs", params={"state": "finished"})
    assert refused.status_code == 422
    assert refused.json()["field"] == "state"


# -- in the browser -------------------------------------------------------------------------------


def done_replay_job(fleet: Fleet) -> dict[str, Any]:
    """A done job of the replay kernel with the most invalid or failed trials."""
    with fleet.http() as http:
        jobs = http.get("/v1/jobs", params={"state": "done", "limit": 1000}).json()
    replay = [job for job in jobs if job["kernel"] == REPLAY_KERNEL]
    return max(replay, key=lambda job: (job["progress"]["invalid"] + job["progress"]["failed"], -job["id"]))


def test_a_done_jobs_charts_hold_the_trials_of_the_store(fleet: Fleet, browser: Browser) -> None:
    job = done_replay_job(fleet)
    with fleet.http("reader") as http:
        trials = http.get(f"/v1/jobs/{job['id']}/trials").json()
    measured = sorted(
        (t for t in trials if t["phase"] == "search" and t["state"] == "measured"), key=lambda t: t["number"]
    )
    bad = [t for t in trials if t["state"] in ("invalid", "failed")]
    validation = [t for t in trials if t["phase"] == "validate"]
    with watched_page(browser, fleet.url, fleet.tokens["reader"]) as watched:
        page = watched.goto(f"/jobs/{job['id']}")
        drawn = {t["name"]: t for t in chart_points(page, "chart-trials")}
        assert drawn["measured"]["x"] == [t["number"] for t in measured]
        assert drawn["measured"]["y"] == [t["median_ms"] for t in measured]
        best = {t["name"]: t for t in chart_points(page, "chart-best")}
        assert best["best so far"]["y"] == running_min([t["median_ms"] for t in measured])
        if job["progress"]["default_ms"] is not None:
            assert drawn["default"]["y"] == [job["progress"]["default_ms"]] * 2
        assert len(chart_points(page, "chart-knobs")) == 1
        chart_points(page, "chart-heatmap")
        failure_rows = page.locator("#table-failures tbody tr td.empty").count() == 0
        shown = page.locator("#table-failures tbody tr").count() if failure_rows else 0
        assert shown == len(bad)
        for trial in bad:
            assert page.locator("#table-failures", has_text=str(trial["reason"])).count() == 1
        validated = page.locator("#table-validation tbody tr td.empty").count() == 0
        assert (page.locator("#table-validation tbody tr").count() if validated else 0) == len(validation)
        header = page.locator("#job-header").inner_text()
        assert job["chip"] in header
        assert job["strategy"] in header
        assert page.locator("#job-state").inner_text() == "done"
        assert page.locator("#job-live").get_attribute("hx-trigger") is None
        screenshot(page, "job")
        screenshot(page, "README-job", full_page=False)
        watched.assert_clean()


def shown_counts(page: Page) -> tuple[int, int]:
    """(trials told, as the header shows it; points in chart-trials)."""
    told = int(page.locator("#job-trials b").inner_text())
    points: int = page.evaluate(
        "(document.getElementById('chart-trials').data || []).filter(t => t.name === 'measured')"
        ".reduce((n, t) => n + t.x.length, 0)"
    )
    return told, points


@pytest.fixture
def own_fleet(tmp_path: Path) -> Iterator[Fleet]:
    """A server of the test's own: the job it tunes must not join the session's fleet."""
    with serving(tmp_path, tuned=False) as own:
        yield own


def test_the_job_page_follows_a_running_job_until_it_is_done(own_fleet: Fleet, browser: Browser) -> None:
    fleet = own_fleet
    sweep = {
        "kernel": REPLAY_KERNEL,
        "shapes": [{"variant": 20}],
        "trials": 40,
        "chips": [REPLAY_CHIP],
        "seed": 5,
    }
    with fleet.http() as http:
        created = http.post("/v1/sweeps", json=sweep)
        assert created.status_code == 201, created.text
        job_id = created.json()["jobs"][0]["id"]
    worker = fleet.start_replay_worker("live", ["--batch", "1", "--replay-trial-ms", "150"])
    try:
        with watched_page(browser, fleet.url, fleet.tokens["reader"]) as watched:
            page = watched.goto(f"/jobs/{job_id}")
            page.evaluate("window.__notReloaded = true")
            assert page.locator("#job-live").get_attribute("hx-trigger") == "every 2s"
            seen = [shown_counts(page)]
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and len({told for told, _ in seen}) < 3:
                page.wait_for_timeout(500)
                if page.locator("#job-state").inner_text() == "done":
                    break
                counts = shown_counts(page)
                if counts != seen[-1]:
                    seen.append(counts)
            told_values = [told for told, _ in seen]
            point_values = [points for _, points in seen]
            assert len(set(told_values)) >= 3, f"the trial count did not grow across polls: {seen}"
            assert told_values == sorted(told_values), seen
            assert point_values == sorted(point_values), seen
            assert point_values[-1] > point_values[0], f"chart-trials got no new points: {seen}"
            page.wait_for_selector("#job-state:text-is('done')", timeout=120_000)
            assert page.evaluate("window.__notReloaded === true"), "the page reloaded instead of polling"
            assert page.locator("#job-live").get_attribute("hx-trigger") is None, "polling goes on"
            with fleet.http("reader") as http:
                trials = http.get(f"/v1/jobs/{job_id}/trials").json()
            measured = sorted(
                (t for t in trials if t["phase"] == "search" and t["state"] == "measured"),
                key=lambda t: t["number"],
            )
            page.wait_for_function(
                "document.getElementById('chart-trials').data"
                f".find(t => t.name === 'measured').x.length === {len(measured)}"
            )
            drawn = {t["name"]: t for t in chart_points(page, "chart-trials")}
            assert drawn["measured"]["y"] == [t["median_ms"] for t in measured]
            screenshot(page, "job-live")
            watched.assert_clean()
    finally:
        stop(worker)


def test_the_jobs_list_filters_and_downloads(fleet: Fleet, browser: Browser) -> None:
    with fleet.http("reader") as http:
        done = http.get("/v1/jobs", params={"state": "done", "limit": 1000}).json()
        answer = http.get("/jobs", params={"state": "done", "format": "csv", "per_page": 500})
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/csv")
        rows = list(csv.DictReader(io.StringIO(answer.text)))
        assert [int(r["id"]) for r in rows] == [job["id"] for job in done]
        assert {r["state"] for r in rows} == {"done"}
        replay = http.get(
            "/jobs", params={"kernel": REPLAY_KERNEL, "chip": REPLAY_CHIP, "format": "json"}
        ).json()
        assert replay
        assert {(r["kernel"], r["chip"]) for r in replay} == {(REPLAY_KERNEL, REPLAY_CHIP)}
        refused = http.get("/jobs", params={"state": "finished"})
        assert refused.status_code == 422
        assert refused.json()["field"] == "state"
    with watched_page(browser, fleet.url, fleet.tokens["reader"]) as watched:
        page = watched.goto("/jobs?state=done&per_page=3")
        assert page.locator("#table-jobs tbody tr").count() == min(3, len(done))
        assert page.locator("select[name=state]").input_value() == "done"
        first = page.locator("#table-jobs tbody tr").first.locator("td").first.inner_text()
        assert int(first) == done[0]["id"]
        page.fill("input[name=kernel]", "softmax")
        with page.expect_navigation(wait_until="networkidle"):
            page.click("#job-filters button[type=submit]")
        assert "kernel=softmax" in page.url
        assert "state=done" in page.url
        kernels = page.locator("#table-jobs tbody tr td:nth-child(2)").all_inner_texts()
        assert kernels
        assert set(kernels) == {"softmax"}
        screenshot(page, "jobs")
        page.locator("#table-jobs tbody tr").first.locator("a").first.click()
        page.wait_for_selector("#job-live")
        chart_points(page, "chart-trials")
        watched.assert_clean()
