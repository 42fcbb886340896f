"""``/signin`` and ``/signout``: a browser's session (see :mod:`tiletune.service.dashboard.session`)."""

from __future__ import annotations

import math
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from tiletune.service.access.auth import ANONYMOUS
from tiletune.service.dashboard.render import render
from tiletune.service.dashboard.session import (
    COOKIE,
    BrowserSessionsDep,
    Viewer,
    ViewerDep,
    is_https,
    read_form,
    safe_next,
)
from tiletune.service.dependencies import SettingsDep, authenticate_request
from tiletune.service.errors import RateLimitedError, UnauthorizedError
from tiletune.service.settings import Settings

router = APIRouter(include_in_schema=False)

NextQuery = Annotated[str, Query(alias="next", max_length=2000, description="the page to return to")]
MAX_TOKEN_CHARS = 200


def duration(seconds: float) -> str:
    """A session limit in words: ``2 hours``, ``90 minutes``, ``1 hour``, ``45 seconds``."""
    for unit, size in (("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            count = int(seconds // size)
            return f"{count} {unit}{'s' if count != 1 else ''}"
    return f"{seconds:g} seconds"


def _signin_page(
    request: Request, settings: Settings, next_path: str, error: str | None, status_code: int = 200
) -> HTMLResponse:
    context = {
        "next": next_path,
        "error": error,
        "idle": duration(settings.session_idle_s),
        "longest": duration(settings.session_max_s),
    }
    return render(request, Viewer(ANONYMOUS, None, False), "signin.html", context, status_code=status_code)


@router.get("/signin")
async def signin_page(request: Request, settings: SettingsDep, next_path: NextQuery = "/") -> Response:
    """The sign-in form."""
    return _signin_page(request, settings, safe_next(next_path), None)


@router.post("/signin")
async def signin(request: Request, sessions: BrowserSessionsDep, settings: SettingsDep) -> Response:
    """Verify the posted token, open a browser session for it and go back to ``next``.

    The cookie holds the new session's id, never the token; a session the browser had is ended.
    Failed sign-ins are limited per address as the API's failed authentications are (429).
    """
    fields = await read_form(request, None)
    secret = (fields.get("token") or [""])[0].strip()
    next_path = safe_next((fields.get("next") or ["/"])[0])
    if not secret or len(secret) > MAX_TOKEN_CHARS:
        return _signin_page(request, settings, next_path, "paste a token (tt_…)", status_code=401)
    try:
        identity = await authenticate_request(request, secret)
    except UnauthorizedError:
        return _signin_page(request, settings, next_path, "that token is unknown or revoked", status_code=401)
    except RateLimitedError:
        return _signin_page(
            request, settings, next_path, "too many failed sign-ins from here; wait", status_code=429
        )
    assert identity.token_id is not None  # a verified token has its row
    previous = request.cookies.get(COOKIE)
    if previous:
        await run_in_threadpool(sessions.close, previous)
    session_id = await run_in_threadpool(sessions.open, identity.token_id)
    response = RedirectResponse(next_path, status_code=303)
    response.set_cookie(
        COOKIE,
        session_id,
        max_age=math.ceil(settings.session_max_s),
        httponly=True,
        samesite="strict",
        secure=is_https(request),
        path="/",
    )
    return response


@router.post("/signout")
async def signout(request: Request, viewer: ViewerDep, sessions: BrowserSessionsDep) -> Response:
    """End the browser's session on the server and forget its cookie."""
    await read_form(request, viewer)
    session_id = request.cookies.get(COOKIE)
    if viewer.from_cookie and session_id:
        await run_in_threadpool(sessions.close, session_id)
    response = RedirectResponse("/", status_code=303)
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict", secure=is_https(request))
    return response
