"""The overview page and the API documentation, in a real browser against the filled server."""

from __future__ import annotations

import httpx
from playwright.sync_api import Browser

from tiletune.service.dashboard.session import COOKIE

from .browser import screenshot, watched_page
from .conftest import REPLAY_CHIP, REPLAY_KERNEL, VARIANTS, Fleet


def test_the_overview_shows_coverage_jobs_and_promotions_of_the_store(fleet: Fleet, browser: Browser) -> None:
    with watched_page(browser, fleet.url, fleet.tokens["reader"]) as watched:
        page = watched.goto("/")
        cell = page.locator("table.coverage tr", has_text=REPLAY_KERNEL)
        headers = page.locator("table.coverage thead th").all_inner_texts()
        column = headers.index(REPLAY_CHIP)
        text = cell.locator("td").nth(column).inner_text()
        assert text.startswith(f"{VARIANTS}/"), text
        done = page.locator("#job-states a", has_text="done").locator(".value").inner_text()
        with fleet.http() as http:
            jobs = http.get("/v1/jobs", params={"state": "done", "limit": 1000}).json()
        assert int(done.replace(",", "")) == len(jobs)
        assert page.locator("#table-promotions tbody tr").count() == min(10, len(jobs))
        screenshot(page, "overview")
        screenshot(page, "README-overview", full_page=False)
        watched.assert_clean()


def test_the_api_docs_load_their_assets_from_our_origin(fleet: Fleet, browser: Browser) -> None:
    with watched_page(browser, fleet.url) as watched:
        page = watched.goto("/docs")
        page.wait_for_selector(".swagger-ui .info")
        assert "tiletune" in page.locator(".swagger-ui .info").inner_text()
        screenshot(page, "docs")
        page = watched.goto("/redoc")
        page.wait_for_selector("redoc h1, [role=main] h1, h1")
        screenshot(page, "redoc")
        watched.assert_clean()


def test_without_a_token_a_page_sends_the_browser_to_sign_in(fleet: Fleet, browser: Browser) -> None:
    with watched_page(browser, fleet.url) as watched:
        page = watched.goto("/?page=1")
        assert page.url.startswith(f"{fleet.url}/signin?next=")
        page.fill("input[name=token]", "tt_not-a-real-token")
        page.click("form.signin button[type=submit]")
        page.wait_for_selector(".error")
        assert "unknown or revoked" in page.locator(".error").inner_text()
        watched.errors.clear()  # the 401 of the refused sign-in is logged by the browser, as it should be
        watched.assert_clean()


def test_a_browser_gets_errors_as_pages_and_the_api_keeps_json(fleet: Fleet, browser: Browser) -> None:
    with watched_page(browser, fleet.url, fleet.tokens["reader"]) as watched:
        response = watched.page.goto(f"{fleet.url}/jobs/999999")
        assert response is not None
        assert response.status == 404
        assert "no job 999999" in watched.page.locator(".error").inner_text()
        response = watched.page.goto(f"{fleet.url}/jobs?page=0")
        assert response is not None
        assert response.status == 422
        assert watched.page.locator("code").first.inner_text() == "page"
        watched.errors.clear()  # the browser logs the two statuses it was sent here on purpose
        watched.assert_clean()
    with fleet.http("reader") as http:
        answer = http.get("/jobs/999999", headers={"Accept": "application/json"})
        assert answer.status_code == 404
        assert answer.json()["code"] == "not_found"
        api = http.get("/v1/jobs/999999", headers={"Accept": "text/html"})
        assert api.json()["code"] == "not_found"


def test_signing_out_ends_the_browsers_session_on_the_server(fleet: Fleet, browser: Browser) -> None:
    with watched_page(browser, fleet.url, fleet.tokens["reader"]) as watched:
        page = watched.goto("/")
        session_id = {c["name"]: c["value"] for c in page.context.cookies()}[COOKIE]
        assert session_id != fleet.tokens["reader"]
        with page.expect_navigation(wait_until="networkidle"):
            page.click("form[action='/signout'] button[type=submit]")
        assert page.context.cookies() == []
        page.goto(f"{fleet.url}/jobs", wait_until="networkidle")
        assert page.url.startswith(f"{fleet.url}/signin?next=")
        watched.assert_clean()
    # a copy of the cookie kept from before is no session any more
    with httpx.Client(base_url=fleet.url, cookies={COOKIE: session_id}, timeout=30) as http:
        answer = http.get("/jobs")
    assert answer.status_code == 303
    assert answer.headers["location"].startswith("/signin?next=")
