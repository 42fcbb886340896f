"""``/signin`` and ``/signout``: a browser's session (see :mod:`tiletune.service.dashboard.session`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import RedirectResponse, Response

from tiletune.service.auth import ANONYMOUS
from tiletune.service.dashboard.render import render
from tiletune.service.dashboard.session import (
    COOKIE,
    SESSION_S,
    Viewer,
    ViewerDep,
    read_form,
    safe_next,
)
from tiletune.service.errors import UnauthorizedError

router = APIRouter(include_in_schema=False)

NextQuery = Annotated[str, Query(alias="next", max_length=2000, description="the page to return to")]
MAX_TOKEN_CHARS = 200


@router.get("/signin")
async def signin_page(request: Request, next_path: NextQuery = "/") -> Response:
    """The sign-in form."""
    context = {"next": safe_next(next_path), "error": None}
    return render(request, Viewer(ANONYMOUS, None, False), "signin.html", context)


@router.post("/signin")
async def signin(request: Request) -> Response:
    """Verify the posted token; set it as the session cookie and go back to ``next``."""
    fields = await read_form(request, None)
    secret = (fields.get("token") or [""])[0].strip()
    next_path = safe_next((fields.get("next") or ["/"])[0])
    error = None
    if not secret or len(secret) > MAX_TOKEN_CHARS:
        error = "paste a token (tt_…)"
    else:
        try:
            await run_in_threadpool(request.app.state.services.tokens.identify, secret)
        except UnauthorizedError:
            error = "that token is unknown or revoked"
    if error is not None:
        context = {"next": next_path, "error": error}
        return render(request, Viewer(ANONYMOUS, None, False), "signin.html", context, status_code=401)
    response = RedirectResponse(next_path, status_code=303)
    response.set_cookie(
        COOKIE,
        secret,
        max_age=SESSION_S,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
    )
    return response


@router.post("/signout")
async def signout(request: Request, viewer: ViewerDep) -> Response:
    """Forget the session cookie."""
    await read_form(request, viewer)
    response = RedirectResponse("/", status_code=303)
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
    return response
