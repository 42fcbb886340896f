"""The limit on guessed tokens, against real ``tiletune server`` processes on one SQLite store.

- Concurrent guesses from one address pass the limit no more than its burst: each takes a
  failure before its token is looked up.
- ``X-Forwarded-For`` from an address outside ``TILETUNE_FORWARDED_ALLOW_IPS`` is ignored: a
  guesser cannot spend another address's budget nor escape its own by naming other addresses;
  from the trusted proxy the forwarded address is the client's.
- A valid token is never refused for what others guessed from its address: one never verified
  by the replica, and one made a moment ago by another replica of the same store; nor when
  more callers than the burst present it at once (those asking during the live digests' read
  wait for its answer).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from sqlalchemy import event

from tests.credentials import ADMIN
from tests.service.processes import ServerProcess, start_server, stop
from tiletune.client.wire import Role
from tiletune.service.access.auth import Tokens
from tiletune.service.database import Database, make_engine, make_sessions
from tiletune.service.migrate import upgrade

BURST = 10
GUESSES = 60
#: The trusted proxy's address (loopback too: a client can bind it).
PROXY = "127.0.0.2"
LIMITED = {
    "TILETUNE_AUTH_FAILURE_BURST": str(BURST),
    "TILETUNE_AUTH_FAILURES_PER_S": "0.001",
    "TILETUNE_FORWARDED_ALLOW_IPS": PROXY,
    "TILETUNE_OPEN_READS": "false",
}
#: How long a token made by another replica may take to be known here (auth.LIVE_REREAD_S and a margin).
ANOTHER_REPLICA_S = 5.0


@pytest.fixture
def served(tmp_path: Path) -> Iterator[ServerProcess]:
    """A server with a burst of :data:`BURST` failures per address that believes :data:`PROXY` only."""
    server = start_server(tmp_path, env=LIMITED)
    try:
        yield server
    finally:
        stop(server.process)


def _new_token(url: str) -> dict[str, str]:
    made = httpx.post(f"{url}/v1/tokens", json={"role": "reader"}, headers=ADMIN, timeout=10)
    assert made.status_code == 201, made.text
    return {"Authorization": f"Bearer {made.json()['token']}"}


def _guess(url: str, number: int) -> int:
    """One wrong token, from 127.0.0.1, naming an address of its own in ``X-Forwarded-For``."""
    headers = {"Authorization": f"Bearer tt_guess-{number}", "X-Forwarded-For": f"203.0.113.{number % 250}"}
    return httpx.get(f"{url}/v1/jobs", headers=headers, timeout=30).status_code


def test_concurrent_guesses_pass_no_more_than_the_burst_and_forwarded_addresses_are_ignored(
    served: ServerProcess,
) -> None:
    reader = _new_token(served.url)  # live, never presented
    with ThreadPoolExecutor(max_workers=16) as pool:
        answers = Counter(pool.map(lambda number: _guess(served.url, number), range(GUESSES)))
    assert answers == {401: BURST, 429: GUESSES - BURST}

    # A valid token from the spent address: looked up and let through.
    assert httpx.get(f"{served.url}/v1/jobs", headers=reader, timeout=10).status_code == 200
    assert _guess(served.url, 0) == 429  # guesses still are not

    # From the trusted proxy, the forwarded address is the client's: a budget of its own.
    with httpx.Client(transport=httpx.HTTPTransport(local_address=PROXY), timeout=10) as proxy:
        forwarded = {"Authorization": "Bearer tt_guess", "X-Forwarded-For": "198.51.100.7"}
        assert proxy.get(f"{served.url}/v1/jobs", headers=forwarded).status_code == 401


def test_a_token_another_replica_made_passes_from_a_spent_address(
    served: ServerProcess, tmp_path: Path
) -> None:
    for number in range(BURST + 1):
        _guess(served.url, number)
    assert _guess(served.url, 0) == 429
    replica = start_server(tmp_path, db_url=served.db_url, env=LIMITED, log_name="replica.log")
    try:
        made_elsewhere = _new_token(replica.url)
    finally:
        stop(replica.process)
    answers: list[int] = []
    deadline = time.monotonic() + ANOTHER_REPLICA_S
    while time.monotonic() < deadline and 200 not in answers:
        answers.append(httpx.get(f"{served.url}/v1/jobs", headers=made_elsewhere, timeout=10).status_code)
        time.sleep(0.1)
    assert answers[-1] == 200, answers
    assert set(answers) <= {200, 429}, answers  # never told the token is wrong


def test_callers_arriving_during_the_live_digests_read_wait_for_its_answer(tmp_path: Path) -> None:
    """Callers past their address's burst ask whether a token may be live at once (wrk's 64
    connections when a remembered token expires, against a burst of 60): the one that reads the
    live digests holds the others until its read is done, and every one is told the token is live."""
    url = f"sqlite:///{tmp_path / 'tokens.db'}"
    upgrade(url)
    engine = make_engine(url, write_lock=False)
    reading = threading.Event()

    @event.listens_for(engine, "before_cursor_execute")
    def slow_read(*_: object) -> None:
        reading.set()
        time.sleep(0.3)  # the read in flight while the others ask

    tokens = Tokens(Database(make_sessions(make_engine(url)), reads=make_sessions(engine)))
    secret = tokens.create(Role.READER, "reader").token
    with ThreadPoolExecutor(max_workers=8) as pool:
        first = pool.submit(tokens.may_be_live, secret)
        assert reading.wait(10)
        others = list(pool.map(tokens.may_be_live, [secret] * 7))
    assert first.result()
    assert others == [True] * 7
    engine.dispose()
