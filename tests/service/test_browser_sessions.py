"""Browser sessions of the dashboard, and sign-in behind a TLS proxy.

- Behind a proxy, ``Settings.public_url`` is our origin too (a Secure cookie over https) without
  any forwarded header being believed.
- Behind a trusted proxy (``Settings.forwarded_allow_ips``), the scheme it reports
  (``X-Forwarded-Proto: https``) is the request's: the browser's ``https`` Origin matches and the
  session cookie is ``Secure``. From any other address the header is not believed. In process
  through the app uvicorn serves (:func:`~tiletune.service.cli.serve.uvicorn_server`, its proxy
  middleware included), and once through a real ``tiletune server --forwarded-allow-ips``.
- The cookie holds a random session id, never the token, and the store holds neither; sign-out
  ends the session on the server; a session ends when idle, at its longest, and when its token
  is revoked; a cookie that holds a token is not a session. On SQLite and PostgreSQL, with the
  store's clock moved by hand.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from http.cookies import Morsel, SimpleCookie
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError
from starlette.types import ASGIApp

from tests.credentials import ADMIN, ADMIN_SECRET, ADMIN_TOKEN
from tests.service.conftest import ManualClock, snapshot
from tests.service.processes import free_port, run_cli, spawn, stop, wait_for_health
from tiletune.service.app import create_app
from tiletune.service.cli.serve import uvicorn_server
from tiletune.service.dashboard.session import COOKIE, MAX_SESSIONS_PER_TOKEN
from tiletune.service.migrate import upgrade
from tiletune.service.settings import Settings

#: The proxy's address, and a network of more proxies, that the served app believes.
PROXY = "10.20.30.40"
PROXY_NETWORK = "10.99.0.0/16"
#: An address nobody said to believe.
ELSEWHERE = "198.51.100.7"
#: The name browsers use for the service (the Host the proxy passes on).
PUBLIC_HOST = "tiletune.example.com"
HTTPS = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.9", "Origin": f"https://{PUBLIC_HOST}"}
IDLE_S = 600.0
MAX_S = 3600.0
SERVER_START_S = 90.0


# -- helpers --------------------------------------------------------------------------------------


def sign_in(client: TestClient | httpx.Client, token: str, **headers: str) -> httpx.Response:
    """Post the sign-in form as a browser does (the client keeps no cookie: tests pass it by hand)."""
    answer = client.post("/signin", data={"token": token, "next": "/jobs"}, headers=headers)
    client.cookies.clear()
    return answer


def session_cookie(answer: httpx.Response) -> Morsel[str]:
    """The session cookie an answer sets."""
    cookies: SimpleCookie = SimpleCookie(answer.headers["set-cookie"])
    return cookies[COOKIE]


def page(client: TestClient, session_id: str, path: str = "/jobs", **headers: str) -> httpx.Response:
    """A page asked for with the session cookie (redirects not followed)."""
    answer: httpx.Response = client.get(path, headers={"Cookie": f"{COOKIE}={session_id}", **headers})
    return answer


def signed_in(answer: httpx.Response) -> bool:
    """True when a page answered as a page, False when it sent the browser to sign in."""
    if answer.status_code == 303:
        assert answer.headers["location"].startswith("/signin?next=")
        return False
    assert answer.status_code == 200, answer.text
    return True


def csrf_of(answer: httpx.Response) -> str:
    """The CSRF token of a page's sign-out form."""
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', answer.text)
    assert found is not None, answer.text
    return found.group(1)


def new_token(client: TestClient, role: str = "reader") -> tuple[int, str]:
    """A new token of ``role`` made through the API: its id and secret."""
    created = client.post("/v1/tokens", json={"role": role, "name": f"browser-{role}"}, headers=ADMIN)
    assert created.status_code == 201, created.text
    return created.json()["id"], created.json()["token"]


# -- behind a proxy: the app uvicorn serves -------------------------------------------------------


@pytest.fixture
def served(tmp_path: Path) -> ASGIApp:
    """The app as ``tiletune server`` serves it, believing :data:`PROXY` and :data:`PROXY_NETWORK`."""
    url = f"sqlite:///{tmp_path / 'proxied.db'}"
    upgrade(url)
    settings = Settings(
        db_url=url,
        admin_token=ADMIN_SECRET,
        open_reads=False,
        forwarded_allow_ips=f"{PROXY}, {PROXY_NETWORK}",
    )
    server, _tokens = uvicorn_server(settings, "0.0.0.0", 0, access_log=False)
    server.config.load()
    app: ASGIApp = server.config.loaded_app
    return app


def from_address(app: ASGIApp, address: str) -> TestClient:
    """A client of ``app`` whose connections come from ``address``, to the public host over http."""
    return TestClient(app, base_url=f"http://{PUBLIC_HOST}", client=(address, 41000), follow_redirects=False)


@pytest.mark.parametrize("proxy", [PROXY, "10.99.7.8"])
def test_a_sign_in_through_a_trusted_https_proxy_gets_a_secure_session(served: ASGIApp, proxy: str) -> None:
    with from_address(served, proxy) as client:
        answer = sign_in(client, ADMIN_TOKEN, **HTTPS)
        assert answer.status_code == 303, answer.text
        cookie = session_cookie(answer)
        assert cookie["secure"] is True
        assert cookie["httponly"] is True
        assert cookie["samesite"].lower() == "strict"
        assert cookie.value != ADMIN_TOKEN

        shown = page(client, cookie.value, **HTTPS)
        assert signed_in(shown)
        out = client.post(
            "/signout", data={"csrf": csrf_of(shown)}, headers={"Cookie": f"{COOKIE}={cookie.value}", **HTTPS}
        )
        assert out.status_code == 303, out.text
        assert session_cookie(out)["secure"] is True
        assert not signed_in(page(client, cookie.value, **HTTPS))


def test_forwarded_headers_from_another_address_are_not_believed(served: ASGIApp) -> None:
    with from_address(served, ELSEWHERE) as client:
        refused = sign_in(client, ADMIN_TOKEN, **HTTPS)
        assert refused.status_code == 403
        assert refused.json()["field"] == "origin"
        assert "set-cookie" not in refused.headers
        # what the connection really is (http) is what counts: no Secure cookie on it
        plain = sign_in(client, ADMIN_TOKEN, **{**HTTPS, "Origin": f"http://{PUBLIC_HOST}"})
        assert plain.status_code == 303, plain.text
        assert session_cookie(plain)["secure"] == ""


def test_behind_a_proxy_the_public_url_is_our_origin_without_any_forwarded_header(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'public.db'}"
    upgrade(url)
    settings = Settings(
        db_url=url, admin_token=ADMIN_SECRET, open_reads=False, public_url=f"https://{PUBLIC_HOST}/"
    )
    server, _tokens = uvicorn_server(settings, "0.0.0.0", 0, access_log=False)
    server.config.load()
    with from_address(server.config.loaded_app, ELSEWHERE) as client:  # a pod: believes nothing it says
        answer = sign_in(client, ADMIN_TOKEN, Origin=f"https://{PUBLIC_HOST}")
        assert answer.status_code == 303, answer.text
        assert session_cookie(answer)["secure"] is True
        for other in (f"https://evil.{PUBLIC_HOST}", f"https://{PUBLIC_HOST}:8443", "null"):
            refused = sign_in(client, ADMIN_TOKEN, Origin=other)
            assert (refused.status_code, refused.json()["field"]) == (403, "origin")


def test_the_public_url_must_be_an_origin() -> None:
    assert (
        Settings(public_url="https://Tiletune.Example.com:8443/").public_url
        == "https://Tiletune.Example.com:8443"
    )
    assert Settings(public_url=" ").public_url is None
    for bad in (
        "tiletune.example.com",
        "ftp://host",
        "https://host/dashboard",
        "https://user@host",
        "https://h:x",
    ):
        with pytest.raises(ValidationError, match="public_url"):
            Settings(public_url=bad)


def test_the_trusted_addresses_must_be_addresses_or_networks() -> None:
    for bad in ("proxy.internal", "10.0.0.1/8", "10.0.0.0/8,*", ""):
        with pytest.raises(ValidationError, match="forwarded_allow_ips"):
            Settings(forwarded_allow_ips=bad)
    assert Settings(forwarded_allow_ips="*").forwarded_allow_ips == "*"
    failed = run_cli("server", "--forwarded-allow-ips", "proxy.internal", "--port", str(free_port()))
    assert failed.returncode != 0
    assert "forwarded_allow_ips" in failed.stderr + failed.stdout
    assert "--forwarded-allow-ips" in failed.stderr + failed.stdout


def test_tiletune_server_believes_forwarded_headers_from_its_proxies_only(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "server.log"
    args = ["--db", f"sqlite:///{tmp_path / 't.db'}", "--port", str(port)]
    proxies = ["--forwarded-allow-ips", "127.0.0.2"]
    process = spawn(["server", *args, *proxies], log_path, {"TILETUNE_OPEN_READS": "false"})
    try:
        wait_for_health(url, process, log_path, SERVER_START_S)
        headers = {"X-Forwarded-Proto": "https", "Origin": f"https://127.0.0.1:{port}"}
        proxy = httpx.HTTPTransport(local_address="127.0.0.2")  # the proxy's address (loopback too)
        with httpx.Client(base_url=url, transport=proxy, timeout=10) as client:
            answer = sign_in(client, ADMIN_TOKEN, **headers)
        assert answer.status_code == 303, answer.text
        assert session_cookie(answer)["secure"] is True
        with httpx.Client(base_url=url, timeout=10) as client:  # from 127.0.0.1: not a proxy
            refused = sign_in(client, ADMIN_TOKEN, **headers)
        assert refused.status_code == 403, refused.text
        assert refused.json()["field"] == "origin"
    finally:
        stop(process)


# -- sessions: a store of its own, its clock moved by hand ----------------------------------------


@pytest.fixture
def client(database_url: str, clock: ManualClock) -> Iterator[TestClient]:
    """The app on an empty store with reads closed and sessions of :data:`IDLE_S` / :data:`MAX_S`."""
    upgrade(database_url)
    settings = Settings(
        db_url=database_url,
        admin_token=ADMIN_SECRET,
        open_reads=False,
        session_idle_s=IDLE_S,
        session_max_s=MAX_S,
    )
    with TestClient(create_app(settings, clock=clock, reaper=False), follow_redirects=False) as client:
        yield client


def test_the_cookie_is_a_session_id_and_the_store_keeps_neither_it_nor_the_token(
    client: TestClient, database_url: str
) -> None:
    _id, token = new_token(client)
    answer = sign_in(client, token)
    assert answer.status_code == 303, answer.text
    cookie = session_cookie(answer)
    assert cookie.value != token
    assert token not in answer.headers["set-cookie"]
    assert re.fullmatch(r"[A-Za-z0-9_-]{43}", cookie.value)  # 256 random bits
    assert cookie["httponly"] is True
    assert cookie["samesite"].lower() == "strict"
    assert cookie["secure"] == ""  # plain http here
    assert int(cookie["max-age"]) == MAX_S
    assert signed_in(page(client, cookie.value))
    stored = repr(snapshot(database_url))
    assert "browser_sessions" in stored
    assert cookie.value not in stored
    assert token not in stored
    # each sign-in is a session of its own
    assert session_cookie(sign_in(client, token)).value != cookie.value


def test_sign_out_ends_the_session_on_the_server(client: TestClient, database_url: str) -> None:
    _id, token = new_token(client)
    session_id = session_cookie(sign_in(client, token)).value
    other = session_cookie(sign_in(client, token)).value
    shown = page(client, session_id)
    out = client.post("/signout", data={"csrf": csrf_of(shown)}, headers={"Cookie": f"{COOKIE}={session_id}"})
    assert out.status_code == 303
    assert session_cookie(out).value == ""
    # the old cookie, kept by whoever copied it, no longer works; the token's other session does
    assert not signed_in(page(client, session_id))
    assert signed_in(page(client, other))
    assert len(snapshot(database_url)["browser_sessions"]) == 1


def test_a_session_ends_when_idle_and_at_its_longest(client: TestClient, clock: ManualClock) -> None:
    _id, token = new_token(client)
    idle = session_cookie(sign_in(client, token)).value
    used = session_cookie(sign_in(client, token)).value
    step_s = IDLE_S - 100
    steps = int(MAX_S // step_s)  # 7 steps of 500 s: 3,500 s in all
    for _ in range(steps):
        clock.advance(step_s)
        assert signed_in(page(client, used))  # used within the idle limit each time: still on
    assert not signed_in(page(client, idle))
    clock.advance(MAX_S - steps * step_s)
    ended = page(client, used)
    assert not signed_in(ended)
    assert session_cookie(ended).value == ""  # the browser forgets the cookie


def test_revoking_the_token_ends_its_sessions(client: TestClient, database_url: str) -> None:
    token_id, token = new_token(client)
    other_id, other = new_token(client)
    session_id = session_cookie(sign_in(client, token)).value
    unused = session_cookie(sign_in(client, token)).value
    kept = session_cookie(sign_in(client, other)).value
    assert signed_in(page(client, session_id))
    assert client.post(f"/v1/tokens/{token_id}/revoke", headers=ADMIN).status_code == 200
    assert not signed_in(page(client, session_id))
    assert not signed_in(page(client, unused))
    assert signed_in(page(client, kept))
    assert sign_in(client, token).status_code == 401
    sign_in(client, other)  # a sign-in clears ended sessions away
    assert {row[2] for row in snapshot(database_url)["browser_sessions"]} == {other_id}


def test_a_token_holds_a_bounded_number_of_sessions(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'many.db'}"
    upgrade(url)
    settings = Settings(db_url=url, admin_token=ADMIN_SECRET, open_reads=False)
    with TestClient(create_app(settings, reaper=False), follow_redirects=False) as client:
        first = session_cookie(sign_in(client, ADMIN_TOKEN)).value
        second = session_cookie(sign_in(client, ADMIN_TOKEN)).value
        for _ in range(MAX_SESSIONS_PER_TOKEN - 1):
            newest = session_cookie(sign_in(client, ADMIN_TOKEN)).value
        assert len(snapshot(url)["browser_sessions"]) == MAX_SESSIONS_PER_TOKEN
        assert not signed_in(page(client, first))  # the oldest made room
        assert signed_in(page(client, second))
        assert signed_in(page(client, newest))


def test_a_cookie_holding_a_token_is_not_a_session(client: TestClient) -> None:
    _id, token = new_token(client)
    for cookie in (token, ADMIN_TOKEN, "x" * 5000):
        refused = page(client, cookie)
        assert not signed_in(refused)
        assert session_cookie(refused).value == ""


def test_failed_sign_ins_and_page_bearers_are_limited_per_address(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'guesses.db'}"
    upgrade(url)
    settings = Settings(
        db_url=url,
        admin_token=ADMIN_SECRET,
        open_reads=False,
        auth_failure_burst=3,
        auth_failures_per_s=0.001,
    )
    app = create_app(settings, reaper=False)
    with TestClient(app, client=("192.0.2.1", 40000), follow_redirects=False) as client:
        for _ in range(2):
            assert sign_in(client, "tt_a-guess").status_code == 401
        guessed_page = client.get("/jobs", headers={"Authorization": "Bearer tt_another-guess"})
        assert guessed_page.status_code == 401
        limited = sign_in(client, "tt_a-third-guess")
        assert limited.status_code == 429
        assert COOKIE not in limited.headers.get("set-cookie", "")
        assert sign_in(client, ADMIN_TOKEN).status_code == 303  # a valid token is never refused
        assert client.get("/jobs", headers={"Authorization": "Bearer tt_guess"}).status_code == 429
    elsewhere = TestClient(app, client=("198.51.100.7", 40000), follow_redirects=False)
    assert sign_in(elsewhere, ADMIN_TOKEN).status_code == 303  # another address: its own budget
