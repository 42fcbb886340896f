"""The compare page: its rows against a store of known best configs, and the page in a real browser.

The session's fleet has one chip per kernel, so the content tests build their own store: an
SQLite file with two chips registered through the worker protocol and best configs imported as
bundles (:func:`compared_store`), read through the app in-process (``?format=json`` and the
HTML). The browser tests load the page on the fleet's server (clean, its chart holds the rows)
and on a server process serving the filled store (the screenshot).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from playwright.sync_api import Browser

from tests.bundles import SOFTWARE, sealed
from tests.credentials import ADMIN, ADMIN_SECRET
from tests.service.processes import start_server, stop
from tiletune.kernels import DeviceLimits, get_kernel
from tiletune.service.app import create_app
from tiletune.service.migrate import upgrade
from tiletune.service.settings import Settings

from .browser import chart_points, screenshot, watched_page
from .conftest import REPLAY_CHIP, VARIANTS, Fleet

CHIP_A = "cpu/Compare A (AVX2)/2c"
CHIP_B = "cpu/Compare B (AVX512)/8c"
LIMITS = DeviceLimits(local_memory_bytes=1 << 20)
NEWER = {"torch": "2.14.0", "python": "3.11"}

#: add's shape n -> (a's ms, b's ms); None: not tuned on that chip.
ADD_TIMES: dict[int, tuple[float | None, float | None]] = {
    1024: (1.0, 2.0),  # regression ×2
    2048: (1.0, 0.5),  # improvement
    3072: (1.0, 1.01),  # within noise
    4096: (1.0, None),  # a only
    8192: (None, 3.0),  # b only
}
SOFTMAX_TIMES = {64: (2.0, 3.0)}  # rows=64, cols=256: a regression ×1.5


def entry(
    kernel: str, shape: dict[str, int], chip: str, ms: float, software: dict[str, str] = SOFTWARE
) -> dict[str, Any]:
    """A bundle entry with the kernel's default config (valid on the chips' limits)."""
    spec = get_kernel(kernel)
    return {
        "kernel": spec.name,
        "kernel_version": spec.version,
        "shape": shape,
        "shape_key": spec.canonical_shape(shape),
        "dtype": "float32",
        "chip": chip,
        "config": spec.default_config(shape, "float32", LIMITS),
        "median_ms": ms,
        "default_ms": 3.0 * ms,
        "promoted_at": datetime(2026, 1, 1, tzinfo=UTC).isoformat(),
        "software": software,
    }


def key_of(kernel: str, shape: dict[str, int]) -> str:
    return get_kernel(kernel).canonical_shape(shape)


def imported(client: TestClient, *entries: dict[str, Any]) -> None:
    response = client.post("/v1/configs/import", json=sealed(*entries))
    assert response.status_code == 200, response.text


def fill(client: TestClient) -> None:
    """Both chips registered by a worker, their best configs imported (see the constants)."""
    for name in (CHIP_A, CHIP_B):
        limits = {"name": name, "kind": "cpu", "local_memory_bytes": LIMITS.local_memory_bytes}
        body = {"name": "w", "chip": limits, "backends": ["torch"], "software": SOFTWARE}
        assert client.post("/v1/workers", json=body).status_code == 201
    entries = []
    for n, times in ADD_TIMES.items():
        for chip_name, ms in zip((CHIP_A, CHIP_B), times, strict=True):
            if ms is not None:
                entries.append(entry("add", {"n": n}, chip_name, ms))
    for rows, (a_ms, b_ms) in SOFTMAX_TIMES.items():
        shape = {"rows": rows, "cols": 256}
        entries += [entry("softmax", shape, CHIP_A, a_ms), entry("softmax", shape, CHIP_B, b_ms)]
    imported(client, *entries)
    # On chip a, newer software: add n=1024 faster (0.5), n=2048 faster (0.8), n=3072 slower
    # (2.0: an import keeps the faster best, so no promotion under the newer software) ...
    imported(
        client,
        entry("add", {"n": 1024}, CHIP_A, 0.5, NEWER),
        entry("add", {"n": 2048}, CHIP_A, 0.8, NEWER),
        entry("add", {"n": 3072}, CHIP_A, 2.0, NEWER),
    )
    # ... then n=2048 faster again under the older software: its latest promotion there (0.4).
    imported(client, entry("add", {"n": 2048}, CHIP_A, 0.4))


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The URL of an SQLite store filled by :func:`fill` (through the API, in-process)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('compare') / 'compare.db'}"
    upgrade(url)
    with app_client(url) as client:
        fill(client)
    return url


def app_client(url: str) -> TestClient:
    return TestClient(create_app(Settings(db_url=url, admin_token=ADMIN_SECRET), reaper=False), headers=ADMIN)


@pytest.fixture
def client(store: str) -> Iterator[TestClient]:
    with app_client(store) as client:
        yield client


def rows(client: TestClient, **params: Any) -> list[dict[str, Any]]:
    response = client.get("/compare", params={**params, "format": "json"})
    assert response.status_code == 200, response.text
    found: list[dict[str, Any]] = response.json()
    return found


def software_ids(client: TestClient, chip: str) -> dict[str, int]:
    """The chip's software ids by their label in the page's dropdown (``torch 2.13.0`` …)."""
    page = client.get("/compare", params={"chip": chip})
    assert page.status_code == 200, page.text
    options = re.findall(r'<option value="(\d+)"[^>]*>#\d+ · ([^<·]+) ·', page.text)
    found: dict[str, int] = {}
    for value, label in options:
        torch = re.search(r"torch ([\d.]+)", label)
        assert torch is not None, label
        found[torch.group(1)] = int(value)
    return found


#: What chip a and chip b hold after :func:`fill` (chip a's best of a key: its fastest import).
N1024, N2048, N3072 = (key_of("add", {"n": n}) for n in (1024, 2048, 3072))
SOFTMAX = key_of("softmax", {"rows": 64, "cols": 256})
A_AGAINST_B = [  # (kernel, shape, a's ms, b's ms), regressions first
    ("add", N1024, 0.5, 2.0),  # ×4
    ("softmax", SOFTMAX, 2.0, 3.0),  # ×1.5
    ("add", N2048, 0.4, 0.5),  # ×1.25
    ("add", N3072, 1.0, 1.01),  # noise
]


def test_chip_against_chip_lists_the_keys_both_tuned_with_their_ratio_regressions_first(
    client: TestClient,
) -> None:
    found = rows(client, a=CHIP_A, b=CHIP_B)
    assert [(r["kernel"], r["shape"], r["a_ms"], r["b_ms"]) for r in found] == A_AGAINST_B
    for row in found:
        assert row["ratio"] == pytest.approx(row["b_ms"] / row["a_ms"])
        assert row["dtype"] == "float32"
        assert row["kernel_version"] == get_kernel(row["kernel"]).version
    assert [r["shape"] for r in rows(client, a=CHIP_A, b=CHIP_B, kernel="softmax")] == [SOFTMAX]
    back = rows(client, a=CHIP_B, b=CHIP_A)  # the ratios invert: a→b's mildest regression leads
    assert [r["shape"] for r in back] == [N3072, N2048, SOFTMAX, N1024]
    assert [r["shape"] for r in rows(client, a=CHIP_A, b=CHIP_B, per_page=3, page=2)] == [N3072]
    by_a = rows(client, a=CHIP_A, b=CHIP_B, sort="a_ms")
    assert [r["a_ms"] for r in by_a] == [0.4, 0.5, 1.0, 2.0]


def test_the_summary_and_chart_hold_every_common_key(client: TestClient) -> None:
    page = client.get("/compare", params={"a": CHIP_A, "b": CHIP_B, "per_page": 2})
    assert page.status_code == 200, page.text
    cards = {
        label.strip(): value
        for value, label in re.findall(
            r'<div class="value">([^<]+)</div><div class="label">([^<(]+)', page.text
        )
    }
    ratios = sorted(b / a for _, _, a, b in A_AGAINST_B)
    assert cards["common keys"] == "4"
    assert cards["median b / a"] == f"{(ratios[1] + ratios[2]) / 2:.2f}×"
    assert cards["regressed"] == "3"
    assert cards["improved"] == "0"
    match = re.search(
        r'<script type="application/json" id="chart-compare-figure">(.*?)</script>', page.text, re.S
    )
    assert match is not None
    points = json.loads(match.group(1))["data"][0]  # the page's rows (2 of 4)
    assert points["x"] == [0.5, 2.0]
    assert points["y"] == [2.0, 3.0]


def test_software_against_software_compares_each_keys_latest_promotion_under_each(
    client: TestClient,
) -> None:
    ids = software_ids(client, CHIP_A)
    assert set(ids) == {"2.13.0", "2.14.0"}
    found = rows(client, chip=CHIP_A, software_a=ids["2.13.0"], software_b=ids["2.14.0"])
    # n=2048: latest under 2.13.0 is 0.4 (after 1.0), under 2.14.0 0.8; n=1024: 1.0 then 0.5.
    # n=3072 and softmax have no promotion under 2.14.0: not common.
    assert [(r["shape"], r["a_ms"], r["b_ms"]) for r in found] == [
        (key_of("add", {"n": 2048}), 0.4, 0.8),
        (key_of("add", {"n": 1024}), 1.0, 0.5),
    ]
    assert [r["ratio"] for r in found] == [pytest.approx(2.0), pytest.approx(0.5)]
    other = software_ids(client, CHIP_B)
    refused = client.get(
        "/compare", params={"chip": CHIP_A, "software_a": ids["2.13.0"], "software_b": other["2.13.0"]}
    )
    assert refused.status_code == 422
    assert refused.json()["field"] == "software_b"


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"a": CHIP_A, "b": "cpu/nobody"}, "b"),
        ({"a": CHIP_A, "chip": CHIP_A}, "chip"),
        ({"chip": "cpu/nobody"}, "chip"),
        ({"a": CHIP_A, "b": CHIP_B, "sort": "colour"}, "sort"),
        ({"a": CHIP_A, "b": CHIP_B, "kernel": "nope"}, "kernel"),
        ({"chip": CHIP_A, "software_a": "x", "software_b": "1"}, "software_a"),
    ],
)
def test_bad_input_is_a_422_naming_the_field(client: TestClient, params: dict[str, str], field: str) -> None:
    response = client.get("/compare", params=params)
    assert response.status_code == 422, response.text
    body = response.json()
    assert body.get("field") == field or field in json.dumps(body), body


def test_without_both_sides_the_page_is_the_form(client: TestClient) -> None:
    page = client.get("/compare", params={"a": CHIP_A})
    assert page.status_code == 200
    assert 'id="compare-hint"' in page.text
    assert "chart-compare" not in page.text
    assert rows(client, a=CHIP_A) == []


def test_the_fleet_compared_with_itself_and_with_a_chip_of_other_kernels(
    fleet: Fleet, browser: Browser
) -> None:
    with fleet.http("reader") as http:
        exported = http.get("/v1/configs", params={"chip": REPLAY_CHIP}).json()
    best = sorted(entry["median_ms"] for entry in exported["configs"])
    assert len(best) >= VARIANTS  # the misses page's test may have tuned more by now
    with watched_page(browser, fleet.url, fleet.tokens["reader"]) as watched:
        page = watched.goto("/compare")
        options = page.locator("#compare-chips select[name=a] option").all_inner_texts()
        assert REPLAY_CHIP in options
        other = next(name for name in options if name not in (REPLAY_CHIP, "choose a chip"))
        page.select_option("#compare-chips select[name=a]", REPLAY_CHIP)
        page.select_option("#compare-chips select[name=b]", other)
        with page.expect_navigation(wait_until="networkidle"):
            page.click("#compare-chips button[type=submit]")
        assert "no common keys" in page.locator("#table-compare").inner_text()
        assert page.locator("#chart-compare").count() == 0
        page = watched.goto(f"/compare?a={REPLAY_CHIP}&b={REPLAY_CHIP}")
        traces = chart_points(page, "chart-compare")
        points = traces[0]
        assert isinstance(points["x"], list)
        assert isinstance(points["y"], list)
        assert sorted(points["x"]) == best
        assert sorted(points["y"]) == best
        assert page.locator("#table-compare tbody tr").count() == len(best)
        watched.assert_clean()


def test_a_server_on_the_compared_store_shows_the_comparison(
    store: str, browser: Browser, tmp_path: Path
) -> None:
    server = start_server(tmp_path, db_url=store)
    try:
        with watched_page(browser, server.url, ADMIN["Authorization"].removeprefix("Bearer ")) as watched:
            page = watched.goto(f"/compare?a={CHIP_A}&b={CHIP_B}")
            traces = chart_points(page, "chart-compare")
            assert traces[0]["x"] == [a for _, _, a, _ in A_AGAINST_B]
            assert page.locator("#table-compare tbody tr").first.get_attribute("class") == "regressed"
            screenshot(page, "compare")
            page.select_option("#compare-software select[name=chip]", CHIP_A)
            with page.expect_navigation(wait_until="networkidle"):
                page.click("#compare-software button[type=submit]")
            assert page.locator("#compare-software select[name=software_a] option").count() == 3
            watched.assert_clean()
    finally:
        stop(server.process)
