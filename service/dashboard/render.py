"""Rendering pages: the Jinja2 environment, the values every page gets, and number formats.

Templates live in ``templates/`` (autoescaped). Every page extends ``base.html`` and gets:

- ``viewer`` (:class:`~tiletune.service.dashboard.session.Viewer`) and ``csrf`` for its forms;
- ``asset(name)``: the URL of a static file (:mod:`~tiletune.service.dashboard.assets`);
- ``url_with(**changes)``: this page's URL with query parameters changed (``None`` drops one),
  so every filter, sort and page lives in the URL;
- the filters ``ms`` (a time in milliseconds), ``ratio`` (``1.23×``), ``when`` (a UTC time),
  ``speedup_class`` (the CSS class colouring a speedup) and ``shape_url``.

A chart is a ``<div class="chart" id=ID>`` beside ``<script type="application/json"
id=ID-figure>`` holding its Plotly figure (``data`` and ``layout``): ``static/dashboard.js``
draws it, and draws it again when htmx swaps in new figure data (the job page's live part).
Tests read the drawn points back from ``document.getElementById(ID).data``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from fastapi import Request
from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

from tiletune.service.dashboard.assets import assets_of
from tiletune.service.dashboard.session import Viewer

TEMPLATES = Path(__file__).parent / "templates"

#: What every dashboard answer carries: no script, style, image or request from another origin.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self' 'unsafe-eval'; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data: blob:; connect-src 'self'; worker-src 'self' blob:; "
        "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def format_ms(value: float | None) -> str:
    """A time in milliseconds with three significant digits ('—' when unknown)."""
    if value is None or not math.isfinite(value):
        return "—"
    if value >= 100:
        return f"{value:,.0f} ms"
    if value >= 0.01:
        return f"{value:.3g} ms"
    return f"{value * 1000:.3g} µs"


def format_ratio(value: float | None) -> str:
    """A ratio such as a speedup: ``1.23×`` ('—' when unknown)."""
    if value is None or not math.isfinite(value):
        return "—"
    return f"{value:.2f}×"


def format_when(value: datetime | None) -> str:
    """A time as ``2026-12-01 14:05:09 UTC`` ('—' when unknown)."""
    if value is None:
        return "—"
    return value.strftime("%Y-%m-%d %H:%M:%S UTC")


#: Upper bounds of the speedup colour classes (``speedup-0`` … ``speedup-6``): slower than the
#: default is red, about the same grey, faster ever greener.
SPEEDUP_BOUNDS = (0.95, 1.02, 1.1, 1.3, 1.7, 2.5)


def speedup(default_ms: float | None, best_ms: float | None) -> float | None:
    """The default's time over the best's (``None`` when either is unknown)."""
    return default_ms / best_ms if default_ms and best_ms else None


def speedup_class(value: float | None) -> str:
    """The CSS class colouring a speedup over the default ('speedup-none' when unknown)."""
    if value is None or not math.isfinite(value):
        return "speedup-none"
    return f"speedup-{sum(value > bound for bound in SPEEDUP_BOUNDS)}"


def shape_url(kernel: str, shape_key: str, dtype: str | None = None) -> str:
    """The shape page of a key."""
    url = f"/kernels/{quote(kernel, safe='')}/shapes/{quote(shape_key, safe='=,')}"
    return url + (f"?dtype={quote(dtype)}" if dtype else "")


def _environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=select_autoescape(["html"]),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        ms=format_ms, ratio=format_ratio, when=format_when, speedup_class=speedup_class, shape_url=shape_url
    )
    return env


ENVIRONMENT = _environment()


def url_with(request: Request, **changes: object) -> str:
    """This request's URL with query parameters changed (``None`` removes one)."""
    params = dict(request.query_params)
    for name, value in changes.items():
        if value is None:
            params.pop(name, None)
        else:
            params[name] = str(value)
    query = urlencode(params)
    return request.url.path + (f"?{query}" if query else "")


def render(
    request: Request, viewer: Viewer, template: str, context: Mapping[str, Any], status_code: int = 200
) -> HTMLResponse:
    """The page ``template`` rendered with ``context`` and what every page gets."""
    assets = assets_of(request)
    values = {
        "request": request,
        "viewer": viewer,
        "csrf": viewer.csrf,
        "asset": assets.url,
        "url_with": lambda **changes: url_with(request, **changes),
        **context,
    }
    html = ENVIRONMENT.get_template(template).render(values)
    return HTMLResponse(html, status_code=status_code, headers=SECURITY_HEADERS)


#: A log axis whose every tick reads as a number (Plotly labels minor log ticks "2", "5" by default).
LOG_AXIS: dict[str, Any] = {"type": "log", "minorloglabels": "complete"}


def figure(data: list[dict[str, Any]], layout: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A Plotly figure for a page's chart, with the dashboard's common layout under ``layout``."""
    base: dict[str, Any] = {
        "margin": {"l": 60, "r": 20, "t": 30, "b": 50},
        "height": 360,
        "legend": {"orientation": "h", "y": -0.2},
        "font": {"family": "system-ui, sans-serif", "size": 12},
    }
    base.update(layout or {})
    return {"data": data, "layout": base}
