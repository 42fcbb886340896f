"""``/docs`` (Swagger UI) and ``/redoc`` (ReDoc) with their assets from our own origin.

FastAPI's stock pages load both from a CDN and are blank on an offline cluster; these load
them from :mod:`~tiletune.service.dashboard.assets` (vendored copies: ``static/VENDORED.md``),
with Swagger UI's online validator and ReDoc's web fonts turned off.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse

from tiletune.service.dashboard.assets import assets_of

router = APIRouter(include_in_schema=False)


@router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    """The API's interactive documentation."""
    assets = assets_of(request)
    return get_swagger_ui_html(
        openapi_url="/openapi.json",
        title="tiletune API",
        swagger_js_url=assets.url("swagger-ui-bundle.js"),
        swagger_css_url=assets.url("swagger-ui.css"),
        swagger_favicon_url=assets.url("favicon.png"),
        swagger_ui_parameters={"validatorUrl": None},
    )


@router.get("/redoc")
async def redoc(request: Request) -> HTMLResponse:
    """The API's reference documentation."""
    assets = assets_of(request)
    return get_redoc_html(
        openapi_url="/openapi.json",
        title="tiletune API",
        redoc_js_url=assets.url("redoc.standalone.js"),
        redoc_favicon_url=assets.url("favicon.png"),
        with_google_fonts=False,
    )
