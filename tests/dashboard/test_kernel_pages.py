"""The kernel and shape pages: in a real browser against the filled server, and in process on SQLite.

The browser tests compare what the pages show with what the API answers for the same store
(``/v1/configs``, ``/v1/history``). The in-process tests fill a store of their own through the
API and the service's own functions (a second software fingerprint registered for a chip makes
the bests measured before it stale) and read the pages' downloads.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import pytest
from fastapi.testclient import TestClient
from playwright.sync_api import Browser

from tests.credentials import ADMIN, ADMIN_SECRET
from tiletune.kernels import DeviceLimits, get_kernel
from tiletune.kernels.peaks import peak_fraction, peak_of
from tiletune.service import configs
from tiletune.service.app import create_app
from tiletune.service.dashboard.pages import readable
from tiletune.service.dashboard.render import shape_url
from tiletune.service.fleet import chip_by_name, newest_software_id
from tiletune.service.migrate import upgrade
from tiletune.service.settings import Settings

from .browser import chart_points, screenshot, watched_page
from .conftest import REPLAY_CHIP, REPLAY_KERNEL, SOFTMAX_SHAPES, VARIANTS, Fleet

# -- in process ------------------------------------------------------------------------------------

CPU_CHIP = "cpu/Test CPU (AVX2)/2c"
GPU_CHIP = "cuda/NVIDIA H200/sm_90"
OLD_SOFTWARE = {"python": "3.12.1", "torch": "2.4.0"}
NEW_SOFTWARE = {"python": "3.12.1", "torch": "2.5.1"}
LIMITS = DeviceLimits(1 << 20, 4, 32, "cpu")


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    """The app in process on SQLite (an admin's token on every request)."""
    url = f"sqlite:///{tmp_path / 'tiletune.db'}"
    upgrade(url)
    with TestClient(
        create_app(Settings(db_url=url, admin_token=ADMIN_SECRET), reaper=False), headers=ADMIN
    ) as test:
        yield test


def register(client: TestClient, chip: str, software: dict[str, str]) -> None:
    """Register a worker on ``chip`` with ``software`` through the API."""
    kind = chip.split("/", 1)[0]
    body = {
        "name": f"worker-{kind}",
        "chip": {"name": chip, "kind": kind, "local_memory_bytes": LIMITS.local_memory_bytes},
        "backends": ["torch"],
        "software": software,
    }
    answer = client.post("/v1/workers", json=body)
    assert answer.status_code == 201, answer.text


def promote(
    client: TestClient,
    chip: str,
    shape: dict[str, int],
    times: tuple[float, float],
    version: int = 1,
) -> None:
    """Promote a best config of softmax at ``shape`` on ``chip`` (``times``: best and default ms),
    measured with the chip's newest software."""
    median_ms, default_ms = times
    spec = get_kernel("softmax")
    db = client.app.state.services.db  # type: ignore[attr-defined]
    with db.write() as session:
        chip_row = chip_by_name(session, chip)
        assert chip_row is not None
        software = newest_software_id(session, chip_row.id)
        key = configs.JobKey("softmax", version, spec.canonical_shape(shape), "float32", chip_row.id)
        config = spec.default_config(shape, "float32", LIMITS)
        winner = configs.Winner(shape, config, median_ms, config, default_ms, software_id=software)
        configs.promote(session, key, winner, db.clock())


def json_rows(client: TestClient, path: str, **params: Any) -> list[dict[str, Any]]:
    """A page's table downloaded as JSON."""
    answer = client.get(path, params={**params, "format": "json"})
    assert answer.status_code == 200, answer.text
    rows: list[dict[str, Any]] = answer.json()
    return rows


@pytest.fixture
def filled(client: TestClient) -> TestClient:
    """Softmax bests on a CPU chip (two measured before its software changed) and on an H200."""
    register(client, CPU_CHIP, OLD_SOFTWARE)
    promote(client, CPU_CHIP, {"rows": 64, "cols": 256}, (0.5, 1.0))
    promote(client, CPU_CHIP, {"rows": 256, "cols": 1024}, (2.0, 3.0))
    register(client, CPU_CHIP, NEW_SOFTWARE)  # the fleet moved on: the two above are stale
    promote(client, CPU_CHIP, {"rows": 128, "cols": 512}, (1.0, 4.0))
    promote(client, CPU_CHIP, {"rows": 64, "cols": 64}, (0.2, 0.2), version=2)  # another kernel version
    register(client, GPU_CHIP, NEW_SOFTWARE)
    promote(client, GPU_CHIP, {"rows": 4096, "cols": 4096}, (0.05, 0.08))
    return client


def test_the_kernel_page_marks_bests_of_other_software_or_kernel_versions_stale(filled: TestClient) -> None:
    rows = json_rows(filled, "/kernels/softmax", chip=CPU_CHIP)
    stale = {row["shape"]: row["stale"] for row in rows}
    assert stale == {
        "rows=64,cols=256": "software",
        "rows=256,cols=1024": "software",
        "rows=128,cols=512": None,
        "rows=64,cols=64": "kernel v2 → v1",
    }
    only_stale = json_rows(filled, "/kernels/softmax", chip=CPU_CHIP, stale="true")
    assert sorted(row["shape"] for row in only_stale) == [
        "rows=256,cols=1024",
        "rows=64,cols=256",
        "rows=64,cols=64",
    ]
    html = filled.get("/kernels/softmax", params={"chip": CPU_CHIP}).text
    assert html.count('<tr class="stale">') == 3
    summary = {row["chip"]: row for row in json_rows(filled, "/kernels/softmax", table="chips")}
    assert summary[CPU_CHIP]["tuned"] == 4
    assert summary[CPU_CHIP]["stale"] == 3
    assert summary[CPU_CHIP]["median_speedup"] == pytest.approx((1.5 + 2.0) / 2)  # of 1, 1.5, 2, 4
    assert summary[GPU_CHIP]["stale"] == 0


def test_the_kernel_page_sorts_filters_and_pages_in_the_store(filled: TestClient) -> None:
    by_speedup = json_rows(filled, "/kernels/softmax", sort="-speedup")
    speedups = [row["speedup"] for row in by_speedup]
    assert speedups == sorted(speedups, reverse=True)
    assert len(speedups) == 5
    assert [row["shape"] for row in json_rows(filled, "/kernels/softmax", q="cols=1024")] == [
        "rows=256,cols=1024"
    ]
    assert {row["chip"] for row in json_rows(filled, "/kernels/softmax", chip=GPU_CHIP)} == {GPU_CHIP}
    pages = [json_rows(filled, "/kernels/softmax", sort="best_ms", per_page=2, page=n) for n in (1, 2, 3)]
    assert [len(page) for page in pages] == [2, 2, 1]
    times = [row["best_ms"] for page in pages for row in page]
    assert times == sorted(times)
    html = filled.get("/kernels/softmax", params={"per_page": 2}).text
    assert "5 rows · page 1 of 3" in html


def test_the_kernel_page_reports_throughput_and_the_fraction_of_a_known_peak(filled: TestClient) -> None:
    spec = get_kernel("softmax")
    shape = {"rows": 4096, "cols": 4096}
    (row,) = json_rows(filled, "/kernels/softmax", chip=GPU_CHIP)
    flops, moved = spec.flops(shape) / 0.05e-3, spec.bytes_moved(shape, "float32") / 0.05e-3
    assert row["gflops"] == readable(flops / 1e9)
    assert row["gbps"] == readable(moved / 1e9)
    assert row["peak_fraction"] == readable(peak_fraction(peak_of(GPU_CHIP, "float32"), flops, moved) or 0)
    assert row["peak_fraction"] == readable(moved / 4.8e12)  # softmax is bound by memory
    cpu = json_rows(filled, "/kernels/softmax", chip=CPU_CHIP)
    assert all(row["peak_fraction"] is None and row["gflops"] is not None for row in cpu)


def test_the_kernel_pages_refuse_bad_input_naming_the_field(filled: TestClient) -> None:
    cases = [
        ("/kernels/softmax?sort=-nope", 422, "sort"),
        ("/kernels/softmax?dtype=float64", 422, "dtype"),
        ("/kernels/softmax?per_page=0", 422, None),
        ("/kernels/no_such_kernel", 404, "kernel"),
        ("/kernels/no_such_kernel/shapes/rows=1,cols=1", 404, "kernel"),
        ("/kernels/softmax/shapes/rows=64", 422, "shape"),
        ("/kernels/softmax/shapes/rows=64,cols=-3", 422, "shape"),
        ("/kernels/softmax/shapes/not a shape", 422, "shape"),
        ("/kernels/softmax/shapes/rows=64,cols=256?dtype=int8", 422, "dtype"),
        ("/kernels/softmax?format=json&table=nope", 422, "table"),
    ]
    for path, status, field in cases:
        answer = filled.get(path)
        assert answer.status_code == status, (path, answer.text)
        if field is not None:
            assert answer.json()["field"] == field, (path, answer.text)


def test_the_shape_page_shows_provenance_history_and_neighbours(filled: TestClient) -> None:
    path = "/kernels/softmax/shapes/cols=256,rows=64"  # any order of dims: the canonical key is read
    (best,) = json_rows(filled, path, table="best", chip=CPU_CHIP)
    assert best["stale"] == "software"
    assert best["best_ms"] == 0.5
    assert best["speedup"] == 2.0
    assert best["software"] == "torch 2.4.0 · python 3.12.1"
    history = json_rows(filled, path, table="history")
    assert [row["median_ms"] for row in history] == [0.5]
    neighbours = json_rows(filled, path, table="neighbours")
    # version 1 only (the v2 best of rows=64,cols=64 is no neighbour of a v1 lookup), nearest first
    assert [(row["chip"], row["shape"]) for row in neighbours] == [
        (CPU_CHIP, "rows=128,cols=512"),
        (CPU_CHIP, "rows=256,cols=1024"),
        (GPU_CHIP, "rows=4096,cols=4096"),
    ]
    assert [row["distance"] for row in neighbours] == [2.0, 4.0, 10.0]
    text = filled.get(path, params={"format": "csv", "table": "history"}).text
    (record,) = csv.DictReader(io.StringIO(text))
    assert float(record["median_ms"]) == 0.5


def test_a_shape_never_tuned_shows_empty_tables(filled: TestClient) -> None:
    answer = filled.get("/kernels/softmax/shapes/rows=8,cols=8")
    assert answer.status_code == 200
    assert "this key is not tuned on any chip yet" in answer.text
    assert "this key was never promoted" in answer.text


# -- in a browser, against the filled server --------------------------------------------------------


def _exported(fleet: Fleet, chip: str, kernel: str) -> list[dict[str, Any]]:
    with fleet.http("reader") as http:
        answer = http.get("/v1/configs", params={"chip": chip, "kernel": kernel})
        assert answer.status_code == 200, answer.text
        entries: list[dict[str, Any]] = answer.json()["configs"]
    return entries


def _table_rows(page: Any, table: str) -> list[dict[str, str]]:
    """The cells of an HTML table on the page, by column title."""
    head = page.locator(f"#table-{table} thead th").all_inner_texts()
    titles = [title.rstrip(" ▲▼") for title in head]
    rows = []
    for row in page.locator(f"#table-{table} tbody tr").all():
        cells = row.locator("td").all_inner_texts()
        if len(cells) == len(titles):
            rows.append(dict(zip(titles, cells, strict=True)))
    return rows


def test_the_kernel_page_lists_every_best_config_of_the_store(fleet: Fleet, browser: Browser) -> None:
    exported = _exported(fleet, REPLAY_CHIP, REPLAY_KERNEL)
    assert len(exported) == VARIANTS
    with watched_page(browser, fleet.url, fleet.tokens["reader"]) as watched:
        page = watched.goto(f"/kernels/{REPLAY_KERNEL}")
        rows = _table_rows(page, "best")
        assert sorted(row["Shape"] for row in rows) == sorted(entry["shape_key"] for entry in exported)
        assert {row["Chip"] for row in rows} == {REPLAY_CHIP}
        speedups = page.locator("#table-best tbody td.speedup").all_inner_texts()
        expected = {
            f"{entry['speedup_vs_default']:.2f}×" for entry in exported if entry["speedup_vs_default"]
        }
        assert set(speedups) == expected
        points = chart_points(page, "chart-speedups")
        assert sorted(x for trace in points for x in trace["x"]) == sorted(  # type: ignore[attr-defined]
            entry["shape_key"] for entry in exported if entry["speedup_vs_default"]
        )
        screenshot(page, "kernel")

        page = watched.goto(f"/kernels/{REPLAY_KERNEL}?sort=-speedup")
        shown = page.locator("#table-best tbody td.speedup").all_inner_texts()
        values = [float(text.rstrip("×")) for text in shown]
        assert values == sorted(values, reverse=True)
        assert page.locator("#table-best thead th a", has_text="Speedup").inner_text().endswith("▼")

        pages = []
        page = watched.goto(f"/kernels/{REPLAY_KERNEL}?per_page=2")
        for number in (1, 2, 3):
            assert f"page {number} of 3" in page.locator("#table-best .table-foot").inner_text()
            pages.append([row["Shape"] for row in _table_rows(page, "best")])
            if number < 3:
                with page.expect_navigation(wait_until="networkidle"):
                    page.click("#table-best a[rel=next]")
        assert [len(shapes) for shapes in pages] == [2, 2, 2]
        assert sorted(shape for shapes in pages for shape in shapes) == sorted(
            e["shape_key"] for e in exported
        )
        watched.assert_clean()


def test_the_kernel_page_filters_by_chip_and_downloads_what_it_shows(fleet: Fleet, browser: Browser) -> None:
    with fleet.http("reader") as http:
        jobs = http.get("/v1/jobs", params={"limit": 1000}).json()
    chips = {job["chip"] for job in jobs if job["kernel"] == "softmax"}
    (cpu_chip,) = chips
    softmax = _exported(fleet, cpu_chip, "softmax")
    assert len(softmax) == len(SOFTMAX_SHAPES)
    with watched_page(browser, fleet.url, fleet.tokens["reader"]) as watched:
        page = watched.goto("/kernels/softmax")
        page.select_option("form.filters select[name=chip]", cpu_chip)
        with page.expect_navigation(wait_until="networkidle"):
            page.click("form.filters button[type=submit]")
        assert parse_qs(urlsplit(page.url).query)["chip"] == [cpu_chip]  # the filter is in the URL
        rows = _table_rows(page, "best")
        assert sorted(row["Shape"] for row in rows) == sorted(entry["shape_key"] for entry in softmax)
        assert {row["Chip"] for row in rows} == {cpu_chip}
        href = page.locator("#table-best .downloads a", has_text="CSV").get_attribute("href")
        assert href is not None
        page = watched.goto(f"/kernels/{REPLAY_KERNEL}")
        page.fill("form.filters input[name=q]", "variant=2")
        with page.expect_navigation(wait_until="networkidle"):
            page.click("form.filters button[type=submit]")
        assert [row["Shape"] for row in _table_rows(page, "best")] == ["variant=2"]
        page = watched.goto(f"/kernels/{REPLAY_KERNEL}?chip={quote(cpu_chip)}")
        assert _table_rows(page, "best") == []  # the replay kernel is tuned on the replay chip alone
        watched.assert_clean()
    with fleet.http("reader") as http:
        text = http.get(href).text
    records = list(csv.DictReader(io.StringIO(text)))
    by_shape = {entry["shape_key"]: entry for entry in softmax}
    assert sorted(record["shape"] for record in records) == sorted(by_shape)
    for record in records:
        entry = by_shape[record["shape"]]
        assert record["chip"] == cpu_chip
        assert float(record["best_ms"]) == entry["median_ms"]
        assert json.loads(record["config"]) == entry["config"]
        assert record["gflops"]  # softmax counts its flops


def test_the_shape_page_charts_every_promotion_of_the_key(fleet: Fleet, browser: Browser) -> None:
    shape_key = "variant=3"
    with fleet.http("reader") as http:
        history = http.get(
            f"/v1/history/{REPLAY_KERNEL}", params={"shape": shape_key, "chip": REPLAY_CHIP}
        ).json()
        best = http.get(
            f"/v1/configs/{REPLAY_KERNEL}", params={"shape": shape_key, "chip": REPLAY_CHIP, "match": "exact"}
        ).json()["best"]
    assert history
    with watched_page(browser, fleet.url, fleet.tokens["reader"]) as watched:
        page = watched.goto(f"{shape_url(REPLAY_KERNEL, shape_key, 'float32')}&chip={REPLAY_CHIP}")
        traces = chart_points(page, "chart-history")
        bests = [trace for trace in traces if trace["meta"]["role"] == "best"]  # type: ignore[index]
        shown = sorted(
            (datetime.fromisoformat(x), y)
            for trace in bests
            for x, y in zip(trace["x"], trace["y"], strict=True)  # type: ignore[call-overload]
        )
        expected = sorted(
            (datetime.fromisoformat(point["promoted_at"]), point["median_ms"]) for point in history
        )
        assert shown == expected
        defaults = [trace for trace in traces if trace["meta"]["role"] == "default"]  # type: ignore[index]
        assert sorted(defaults[0]["y"]) == sorted(p["default_ms"] for p in history if p["default_ms"])  # type: ignore[call-overload]
        (row,) = _table_rows(page, "best")
        assert row["Job"] == f"#{best['job_id']}"
        assert page.locator("#table-best a", has_text=f"#{best['job_id']}").get_attribute("href") == (
            f"/jobs/{best['job_id']}"
        )
        neighbours = _table_rows(page, "neighbours")
        assert [row["Shape"] for row in neighbours][:2] == ["variant=4", "variant=2"]  # |log2| 0.42, 0.58
        assert len(_table_rows(page, "history")) == len(history)
        screenshot(page, "shape")
        watched.assert_clean()


def test_the_served_pages_refuse_a_bad_sort_key_naming_it(fleet: Fleet) -> None:
    with fleet.http("reader") as http:
        answer = http.get(f"/kernels/{REPLAY_KERNEL}", params={"sort": "-variant"})
        assert answer.status_code == 422, answer.text
        assert answer.json()["field"] == "sort"
        assert http.get(f"/kernels/{REPLAY_KERNEL}", params={"sort": "-speedup"}).status_code == 200
