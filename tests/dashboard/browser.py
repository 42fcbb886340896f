"""A real browser for the dashboard's tests: Debian's Chromium driven by Playwright.

Playwright cannot download its own browser here, so it drives ``/usr/bin/chromium``
(``make setup`` installs it). :func:`watched_page` opens a page that records every console
error, page error and failed request, and every request to another origin than the server's:
:meth:`Watched.assert_clean` fails the test on any of them. :func:`screenshot` writes a PNG
to ``test-artefacts/dashboard/`` at the repository's root, the folder CI keeps.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, Playwright, sync_playwright

CHROMIUM = Path("/usr/bin/chromium")
ARTEFACTS = Path(__file__).parents[2] / "test-artefacts" / "dashboard"
#: Milliseconds a page may take to load or a locator to appear on the busy CI machine.
TIMEOUT_MS = 30_000


@contextmanager
def chromium() -> Iterator[Browser]:
    """Headless Chromium; fails (never skips) when it is missing: the dashboard must be tested."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: `make setup` installs it (Debian's chromium package)")
    with sync_playwright() as playwright:
        browser = _launch(playwright)
        try:
            yield browser
        finally:
            browser.close()


def _launch(playwright: Playwright) -> Browser:
    return playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])


@dataclass
class Watched:
    """A page and what went wrong on it so far."""

    page: Page
    origin: str
    errors: list[str] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)

    def goto(self, path: str) -> Page:
        """Load ``path`` of the server and wait until the network is idle; 2xx expected."""
        response = self.page.goto(self.origin + path, wait_until="networkidle")
        assert response is not None, path
        assert response.ok, (path, response.status)
        return self.page

    def assert_clean(self) -> None:
        """No console error, page error, failed request, or request to another origin happened."""
        assert self.foreign == [], f"requests to other origins: {self.foreign}"
        assert self.errors == [], f"errors on the page: {self.errors}"


def _watch(page: Page, origin: str) -> Watched:
    watched = Watched(page, origin)

    def on_console(message: object) -> None:
        if getattr(message, "type", None) == "error":
            watched.errors.append(f"console: {getattr(message, 'text', message)}")

    def on_request(request: object) -> None:
        url = str(getattr(request, "url", ""))
        parts = urlsplit(url)
        if parts.scheme in ("http", "https", "ws", "wss") and f"{parts.scheme}://{parts.netloc}" != origin:
            watched.foreign.append(url)

    def on_failed(request: object) -> None:
        watched.errors.append(f"request failed: {getattr(request, 'url', request)}")

    page.on("console", on_console)
    page.on("pageerror", lambda error: watched.errors.append(f"page error: {error}"))
    page.on("request", on_request)
    page.on("requestfailed", on_failed)
    page.set_default_timeout(TIMEOUT_MS)
    return watched


@contextmanager
def watched_page(browser: Browser, origin: str, token: str | None = None) -> Iterator[Watched]:
    """A fresh browser context on ``origin``, signed in with ``token`` through the sign-in form."""
    context: BrowserContext = browser.new_context(viewport={"width": 1360, "height": 900})
    try:
        watched = _watch(context.new_page(), origin)
        if token is not None:
            sign_in(watched, token)
        yield watched
    finally:
        context.close()


def sign_in(watched: Watched, token: str, next_path: str = "/") -> None:
    """Sign in through the form, as a person would."""
    page = watched.goto(f"/signin?next={next_path}")
    page.fill("input[name=token]", token)
    with page.expect_navigation(wait_until="networkidle"):
        page.click("form.signin button[type=submit]")


def screenshot(page: Page, name: str, full_page: bool = True) -> Path:
    """A PNG of ``page`` (the whole page, else the window) as ``test-artefacts/dashboard/NAME.png``.

    The README's pictures are window-sized ones of the overview and the job page
    (``README-overview``, ``README-job``), copied from here to ``examples/screenshots/``.
    """
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTEFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    return path


def chart_points(page: Page, chart_id: str) -> list[dict[str, object]]:
    """The traces Plotly drew in ``#chart_id`` (its ``data``: what the chart shows, not pixels)."""
    page.wait_for_function(f"document.getElementById({chart_id!r})?.data !== undefined")
    traces: list[dict[str, object]] = page.evaluate(
        f"JSON.parse(JSON.stringify(document.getElementById({chart_id!r}).data))"
    )
    return traces
