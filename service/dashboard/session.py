"""Who looks at a page: sign-in with a token, the browser's session, and forms safe from other sites.

- A page's viewer is the token of ``Authorization: Bearer`` or the browser session of the
  cookie :data:`COOKIE`; without either, anonymous when reads are open, else the browser is
  sent to ``/signin``.
- ``/signin`` is a form: the token is posted (never put in a URL) and verified, and the browser
  gets a session of its own (:class:`BrowserSessions`): a random id of 256 bits in the cookie
  (``HttpOnly``: no script reads it; ``SameSite=Strict``: no other site's request carries it;
  ``Secure`` when the request is https). The token itself is never in the cookie, and the
  server keeps only the id's SHA-256 digest, beside the token that signed in.
- A session acts as its token while that token is not revoked, ends when unused for
  ``Settings.session_idle_s`` and ``Settings.session_max_s`` after sign-in at the latest, and
  ``/signout`` deletes it on the server. A cookie that names no live session (an ended one,
  or a token as cookies held before sessions) is not a session: the browser signs in again.
- Every form that changes something carries :func:`csrf_token` of the viewer's secret (its
  session id or bearer token: a digest another site cannot compute), and every posted form
  must come from our own origin (``Origin``, else ``Sec-Fetch-Site``): :func:`read_form`
  refuses the rest with 403. Our origin is the request's scheme and ``Host``; behind a TLS
  proxy it is ``Settings.public_url`` too, or the scheme the proxy reports
  (``X-Forwarded-Proto``, believed from ``Settings.forwarded_allow_ips`` only).
- A posted form is bounded: at most :data:`MAX_FORM_BYTES` and :data:`MAX_FORM_FIELDS` fields.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Annotated
from urllib.parse import parse_qsl, quote, urlsplit

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import ColumnElement, delete, or_, select, update

from tiletune.client.wire import Role
from tiletune.service.access.auth import ANONYMOUS, Identity
from tiletune.service.database import Database, aware
from tiletune.service.dependencies import DatabaseDep, SettingsDep, authenticate_request, settings_of
from tiletune.service.errors import ForbiddenError, InvalidInputError
from tiletune.service.models import BrowserSessionRow, TokenRow

#: The session cookie: a browser session's random id (HttpOnly, SameSite=Strict, Secure on https).
COOKIE = "tiletune_session"
#: Random bytes of a session id (256 bits).
SESSION_ID_BYTES = 32
#: The longest cookie value read as a session id (an id is 43 characters).
MAX_COOKIE_CHARS = 64
#: A session's last use is written at most this often (or a tenth of the idle limit if shorter):
#: the idle limit holds to within that.
TOUCH_S = 60.0
#: Sessions one token holds at most; signing in beyond that ends its oldest.
MAX_SESSIONS_PER_TOKEN = 100
MAX_FORM_BYTES = 64 * 1024
MAX_FORM_FIELDS = 1000

DEFAULT_PORTS = {"http": 80, "https": 443}


class SignInRequiredError(Exception):
    """The page needs a token and the browser sent none (or a stale session): go to ``/signin``."""

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
    """The CSRF token of a viewer's secret (session id or bearer token): only its holder computes it."""
    return hashlib.sha256(b"tiletune-csrf\0" + secret.encode()).hexdigest()[:32]


def session_digest(session_id: str) -> str:
    """The stored form of a session id."""
    return hashlib.sha256(b"tiletune-session\0" + session_id.encode()).hexdigest()


class BrowserSessions:
    """Opening, checking and closing browser sessions (see the module docstring)."""

    def __init__(self, db: Database, idle_s: float, max_s: float) -> None:
        self.db = db
        self.idle = timedelta(seconds=idle_s)
        self.max = timedelta(seconds=max_s)
        self.touch = timedelta(seconds=min(TOUCH_S, idle_s / 10))

    def open(self, token_id: int) -> str:
        """A new session of the token ``token_id``; returns its id (shown to the browser only).

        Ended sessions are deleted on the way, and the token's oldest beyond
        :data:`MAX_SESSIONS_PER_TOKEN`.
        """
        session_id = secrets.token_urlsafe(SESSION_ID_BYTES)
        now = self.db.clock()
        with self.db.write() as session:
            session.execute(delete(BrowserSessionRow).where(self._ended(now)))
            oldest = session.scalars(
                select(BrowserSessionRow.id)
                .where(BrowserSessionRow.token_id == token_id)
                .order_by(BrowserSessionRow.id.desc())
                .offset(MAX_SESSIONS_PER_TOKEN - 1)
            ).all()
            if oldest:
                session.execute(delete(BrowserSessionRow).where(BrowserSessionRow.id.in_(oldest)))
            session.add(
                BrowserSessionRow(
                    digest=session_digest(session_id),
                    token_id=token_id,
                    created_at=now,
                    last_seen_at=now,
                    expires_at=now + self.max,
                )
            )
        return session_id

    def identify(self, session_id: str) -> Identity | None:
        """The identity of a live session, noting its use; ``None`` when it is not one (any more)."""
        if len(session_id) > MAX_COOKIE_CHARS:
            return None
        presented = session_digest(session_id)
        now = self.db.clock()
        with self.db.read() as session:
            found = session.execute(
                select(BrowserSessionRow, TokenRow)
                .join(TokenRow, TokenRow.id == BrowserSessionRow.token_id)
                .where(BrowserSessionRow.digest == presented)
            ).first()
        if found is None or not hmac.compare_digest(found[0].digest, presented):
            return None
        row, token = found
        if token.revoked_at is not None or self._has_ended(row, now):
            self.close(session_id)
            return None
        if now - aware(row.last_seen_at) >= self.touch:
            with self.db.write() as session:
                session.execute(
                    update(BrowserSessionRow).where(BrowserSessionRow.id == row.id).values(last_seen_at=now)
                )
        return Identity(token_id=token.id, name=token.name, role=Role(token.role))

    def close(self, session_id: str) -> None:
        """End a session for good (nothing happens when there is none)."""
        with self.db.write() as session:
            session.execute(
                delete(BrowserSessionRow).where(BrowserSessionRow.digest == session_digest(session_id))
            )

    def _has_ended(self, row: BrowserSessionRow, now: datetime) -> bool:
        return aware(row.expires_at) <= now or aware(row.last_seen_at) + self.idle <= now

    def _ended(self, now: datetime) -> ColumnElement[bool]:
        """Sessions past a limit, or of a revoked token (an SQL condition)."""
        revoked = select(TokenRow.id).where(TokenRow.revoked_at.is_not(None))
        return or_(
            BrowserSessionRow.expires_at <= now,
            BrowserSessionRow.last_seen_at <= now - self.idle,
            BrowserSessionRow.token_id.in_(revoked),
        )


async def browser_sessions(db: DatabaseDep, settings: SettingsDep) -> BrowserSessions:
    """The app's browser sessions, with its settings' limits (a dependency: :data:`BrowserSessionsDep`)."""
    return BrowserSessions(db, settings.session_idle_s, settings.session_max_s)


BrowserSessionsDep = Annotated[BrowserSessions, Depends(browser_sessions)]


def _bearer(request: Request) -> str | None:
    """The token of ``Authorization: Bearer``, if the request carries one."""
    header = request.headers.get("authorization", "")
    scheme, _, credentials = header.partition(" ")
    return credentials.strip() if scheme.lower() == "bearer" and credentials.strip() else None


def here(request: Request) -> str:
    """The request's path and query: where sign-in sends the browser back to."""
    query = request.url.query
    return request.url.path + (f"?{query}" if query else "")


async def viewer_of(request: Request, sessions: BrowserSessionsDep, settings: SettingsDep) -> Viewer:
    """The page's viewer; :class:`SignInRequiredError` when it needs a sign-in the browser lacks.

    A bearer token that is unknown or revoked is a 401, as on the API, and takes one of the
    address's failed authentications (429 once they are used up: :func:`authenticate_request`).
    """
    bearer = _bearer(request)
    if bearer is not None:
        identity = await authenticate_request(request, bearer)
        return Viewer(identity, csrf_token(bearer), False)
    session_id = request.cookies.get(COOKIE)
    if session_id:
        signed_in = await run_in_threadpool(sessions.identify, session_id)
        if signed_in is None:
            raise SignInRequiredError(here(request), stale=True)
        return Viewer(signed_in, csrf_token(session_id), True)
    if settings.open_reads:
        return Viewer(ANONYMOUS, None, False)
    raise SignInRequiredError(here(request))


ViewerDep = Annotated[Viewer, Depends(viewer_of)]


def _origin(scheme: str, netloc: str) -> str | None:
    """``scheme://host[:port]`` in lower case, without the scheme's default port; ``None`` if unreadable."""
    try:
        parts = urlsplit(f"{scheme}://{netloc}")
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    if not host:
        return None
    host = f"[{host}]" if ":" in host else host
    shown = "" if port is None or port == DEFAULT_PORTS.get(scheme.lower()) else f":{port}"
    return f"{scheme.lower()}://{host}{shown}"


def _our_origins(request: Request) -> set[str]:
    """The request's own origin and ``Settings.public_url``'s, where readable."""
    public_url: str | None = settings_of(request).public_url
    origins = [_origin(request.url.scheme, request.url.netloc)]
    if public_url is not None:
        scheme, _, netloc = public_url.partition("://")
        origins.append(_origin(scheme, netloc))
    return {origin for origin in origins if origin is not None}


def is_https(request: Request) -> bool:
    """True when the browser reaches us over https: the request's scheme (as a trusted proxy
    reports it), or ``Settings.public_url``'s."""
    public_url: str | None = settings_of(request).public_url
    return request.url.scheme == "https" or (public_url or "").startswith("https://")


def same_origin(request: Request) -> bool:
    """True when a posted form comes from a page of our own origin.

    Our origin is the request's scheme (the one a trusted proxy reports) and its ``Host``, or
    the origin of ``Settings.public_url``.
    """
    origin = request.headers.get("origin")
    if origin is not None:
        scheme, _, netloc = origin.partition("://")
        theirs = _origin(scheme, netloc)
        return theirs is not None and theirs in _our_origins(request)
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
