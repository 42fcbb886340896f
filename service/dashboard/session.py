"""Who looks at a page: sign-in with a token, the session cookie, and forms safe from other sites.

- A page's viewer is the token of ``Authorization: Bearer`` or of the session cookie; without
  either, anonymous when reads are open, else the browser is sent to ``/signin``.
- ``/signin`` is a form: the token is posted (never put in a URL), verified, and set as the
  cookie :data:`COOKIE` (``HttpOnly``: no script reads it; ``SameSite=Strict``: no other site's
  request carries it; ``Secure`` behind HTTPS). ``/signout`` clears it.
- Every form that changes something carries :func:`csrf_token` of the viewer's token (a digest
  another site cannot compute), and every posted form must come from our own origin
  (``Origin``, else ``Sec-Fetch-Site``): :func:`read_form` refuses the rest with 403.
- A posted form is bounded: at most :data:`MAX_FORM_BYTES` and :data:`MAX_FORM_FIELDS` fields.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Annotated
from urllib.parse import parse_qsl, quote

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool

from tiletune.client.wire import Role
from tiletune.service.auth import ANONYMOUS, Identity, Tokens
from tiletune.service.errors import ForbiddenError, InvalidInputError, UnauthorizedError

#: The session cookie: the viewer's token (HttpOnly, SameSite=Strict).
COOKIE = "tiletune_session"
#: Seconds a sign-in lasts.
SESSION_S = 12 * 3600
MAX_FORM_BYTES = 64 * 1024
MAX_FORM_FIELDS = 1000


class SignInRequiredError(Exception):
    """The page needs a token and the browser sent none (or a stale one): go to ``/signin``."""

    def __init__(self, next_path: str, stale: bool = False) -> None:
        super().__init__(next_path)
        self.next_path = next_path
        self.stale = stale


@dataclass(frozen=True)
class Viewer:
    """The identity behind a page, and the CSRF token its forms carry (``None`` when anonymous)."""

    identity: Identity
    csrf: str | None
    from_cookie: bool

    def may(self, role: Role) -> bool:
        """True when the viewer holds ``role`` (anonymous viewers hold none)."""
        return self.identity.may(role)


def csrf_token(secret: str) -> str:
    """The CSRF token of a session: a digest of its token, which only its holder can compute."""
    return hashlib.sha256(b"tiletune-csrf\0" + secret.encode()).hexdigest()[:32]


def _presented(request: Request) -> tuple[str | None, bool]:
    """The token the request carries and whether it came from the cookie."""
    header = request.headers.get("authorization", "")
    scheme, _, credentials = header.partition(" ")
    if scheme.lower() == "bearer" and credentials.strip():
        return credentials.strip(), False
    cookie = request.cookies.get(COOKIE)
    return (cookie, True) if cookie else (None, False)


def here(request: Request) -> str:
    """The request's path and query: where sign-in sends the browser back to."""
    query = request.url.query
    return request.url.path + (f"?{query}" if query else "")


async def viewer_of(request: Request) -> Viewer:
    """The page's viewer; :class:`SignInRequiredError` when it needs a token the browser did not send."""
    secret, from_cookie = _presented(request)
    services = request.app.state.services
    if secret is None:
        if services.settings.open_reads:
            return Viewer(ANONYMOUS, None, False)
        raise SignInRequiredError(here(request))
    tokens: Tokens = services.tokens
    identity = tokens.remembered(secret)
    if identity is None:
        try:
            identity = await run_in_threadpool(tokens.identify, secret)
        except UnauthorizedError:
            if not from_cookie:
                raise
            raise SignInRequiredError(here(request), stale=True) from None
    return Viewer(identity, csrf_token(secret), from_cookie)


ViewerDep = Annotated[Viewer, Depends(viewer_of)]


def same_origin(request: Request) -> bool:
    """True when a posted form comes from a page of our own origin."""
    origin = request.headers.get("origin")
    if origin is not None:
        return origin == f"{request.url.scheme}://{request.url.netloc}"
    return request.headers.get("sec-fetch-site", "same-origin") in ("same-origin", "none")


async def read_form(request: Request, viewer: Viewer | None) -> dict[str, list[str]]:
    """A posted form's fields (each a list of values), checked for origin, size and CSRF token.

    ``viewer`` ``None``: a form that needs no session (sign-in); else its ``csrf`` field must be
    the viewer's :func:`csrf_token`. Refusals are 403 (another origin, a bad CSRF token) or 422.
    """
    if not same_origin(request):
        raise ForbiddenError("this form was posted from another site", field="origin")
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        raise InvalidInputError(f"the form is over {MAX_FORM_BYTES} bytes", field="body")
    try:
        pairs = parse_qsl(body.decode("utf-8"), keep_blank_values=True, max_num_fields=MAX_FORM_FIELDS)
    except (UnicodeDecodeError, ValueError) as error:
        raise InvalidInputError(f"the form could not be read: {error}", field="body") from None
    fields: dict[str, list[str]] = {}
    for name, value in pairs:
        fields.setdefault(name, []).append(value)
    if viewer is not None:
        sent = (fields.get("csrf") or [""])[0]
        if viewer.csrf is None or not hmac.compare_digest(sent, viewer.csrf):
            raise ForbiddenError("the form's CSRF token is missing or wrong; reload the page", field="csrf")
    return fields


def safe_next(path: str | None) -> str:
    """A path on this site to return to after sign-in (anything else: ``/``)."""
    if not path or not path.startswith("/") or path.startswith("//") or "\\" in path:
        return "/"
    return path


def signin_url(next_path: str) -> str:
    """The sign-in page that returns to ``next_path``."""
    return "/signin?next=" + quote(safe_next(next_path), safe="")
