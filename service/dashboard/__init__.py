"""The dashboard: server-rendered pages of the API's app, for people who would rather look.

Pages (Jinja2 templates in ``templates/``; live parts polled as HTML fragments with htmx;
charts by Plotly.js; every asset from our own origin, see :mod:`.assets`):

- ``/`` overview (:mod:`.overview`) · ``/signin``, ``/signout`` (:mod:`.signin`)
- ``/jobs`` (:mod:`.jobs_list`); ``/jobs/{id}`` live while it runs, ``/jobs/{id}/live``
  (:mod:`.job_page`, :mod:`.job_charts`)
- ``/kernels/{kernel}`` a kernel's tuned keys (:mod:`.kernel_page`)
- ``/kernels/{kernel}/shapes/{shape_key}`` one key's best, history and neighbours (:mod:`.shape_page`)
- ``/docs`` and ``/redoc`` with local assets (:mod:`.docs`)
- ``/misses`` untuned keys clients asked for, and the button queueing them (:mod:`.misses_page`)
- ``/compare`` two chips, or two software versions of one chip, side by side (:mod:`.compare_page`)

Pages follow the reader rules (:mod:`.session`): open when reads are open, else a token, which
a browser gives once to the sign-in form. Tables work without JavaScript, every filter is in
the URL, and every table downloads as CSV or JSON (:mod:`.tables`). Pages aggregate and page
in SQL: none reads a whole table or search.

Pages reach the database, the settings and the read side through the typed dependencies of
:mod:`tiletune.service.dependencies` (``DatabaseDep``, ``SettingsDep``, ``ReadsDep``), as the API
does; the queries over best configs that pages share are :mod:`tiletune.service.best_configs`'s.
What several pages show alike is in :mod:`.pages`; a page imports no other page.
"""

from __future__ import annotations

from collections.abc import Mapping

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response

from tiletune.client.wire import ErrorBody
from tiletune.service.access.auth import ANONYMOUS
from tiletune.service.dashboard import (
    assets,
    compare_page,
    docs,
    job_page,
    jobs_list,
    kernel_page,
    misses_page,
    overview,
    shape_page,
    signin,
)
from tiletune.service.dashboard.render import render
from tiletune.service.dashboard.session import COOKIE, SignInRequiredError, Viewer, signin_url

ROUTERS = (
    assets.router,
    docs.router,
    signin.router,
    overview.router,
    jobs_list.router,
    job_page.router,
    kernel_page.router,
    shape_page.router,
    misses_page.router,
    compare_page.router,
)


def mount(app: FastAPI) -> None:
    """Add the dashboard's pages, assets and documentation to ``app``."""
    app.state.assets = assets.Assets()
    for router in ROUTERS:
        app.include_router(router)
    app.add_exception_handler(SignInRequiredError, _sign_in)


async def _sign_in(request: Request, error: Exception) -> Response:
    """A page that needs a token: the browser goes to sign in (an htmx poll is told to go there)."""
    assert isinstance(error, SignInRequiredError)
    target = signin_url(error.next_path)
    if request.headers.get("hx-request"):
        response: Response = JSONResponse(
            {"code": "unauthorized", "message": "sign in again", "field": "authorization"},
            status_code=401,
            headers={"HX-Redirect": target},
        )
    else:
        response = RedirectResponse(target, status_code=303)
    if error.stale:
        response.delete_cookie(COOKIE, path="/")
    return response


#: Paths that are the API's, never a page: their errors stay JSON whoever asks.
API_PREFIXES = ("/v1/", "/static/", "/metrics", "/healthz", "/readyz", "/livez", "/openapi.json")


def error_page(
    request: Request, body: ErrorBody, status: int, headers: Mapping[str, str] | None
) -> Response | None:
    """An error as a page when a browser asked for a page (it accepts HTML), else ``None``.

    The page holds the same code, message and field as the JSON body the API would answer.
    """
    if request.url.path.startswith(API_PREFIXES) or "text/html" not in request.headers.get("accept", ""):
        return None
    if request.headers.get("hx-request"):
        return None  # a live fragment's poll: htmx leaves the page as it is on an error
    context = {"status": status, "error": body, "hide_viewer": True}  # who asked is not known here
    page = render(request, Viewer(ANONYMOUS, None, False), "error.html", context, status_code=status)
    page.headers.update(headers or {})
    return page
