"""Miss reports: one key the server will not take never costs the others.

End to end, the sync client against the app of ``conftest.server`` (uvicorn on a thread,
SQLite, threshold 3, the chip registered): a legal key too large to tune is counted with the
others, report after report. Then the client's own account of refusals (:class:`MissLedger`,
with the errors its calls raise) for each kind of field a 422 may name. Then short scripts, real
processes, that never close their client: their misses reach the server at exit, a server down or
silent never holds the exit past its deadline, and a client without a token says once what to set.
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.credentials import ADMIN, ADMIN_TOKEN
from tiletune.client import ClientSettings, ConfigClient
from tiletune.client.calls import ServerRefusedError
from tiletune.client.misses import MissLedger
from tiletune.client.sync import EXIT_REPORT_S
from tiletune.client.wire import ErrorBody, MissesCreate
from tiletune.kernels import client_settings

from .conftest import CHIP, LiveServer, free_port

#: A legal key whose bench holds 24 GiB (add, float32): over the server's default 8 GiB to tune.
HUGE = {"n": 2**30}


def settings(tmp_path: Path) -> ClientSettings:
    return client_settings(cache_dir=tmp_path / "cache", timeout_s=2.0, miss_flush_s=3600.0)


def test_a_key_too_large_to_tune_is_counted_and_never_costs_the_other_keys(
    server: LiveServer, tmp_path: Path
) -> None:
    reports = 4  # the threshold (3) is crossed on the third
    with ConfigClient(server.url, CHIP, token=ADMIN_TOKEN, settings=settings(tmp_path)) as client:
        for _ in range(reports):
            client.core.forget_answers()
            for shape in (HUGE, {"n": 5000}, {"n": 6000}):
                assert client.get("add", shape).match == "default"
            assert client.flush_misses()
    listed = httpx.get(f"{server.url}/v1/misses").json()
    assert {row["shape_key"]: row["count"] for row in listed} == {
        "n=1073741824": reports,
        "n=5000": reports,
        "n=6000": reports,
    }
    assert {row["shape_key"] for row in listed if row["job_id"] is not None} == {"n=5000", "n=6000"}


def ledger() -> MissLedger:
    warned: set[object] = set()

    def warn_once(kind: object, message: str, *args: object) -> None:
        if kind not in warned:
            warned.add(kind)
            logging.getLogger("tiletune.client").warning(message, *args)

    book = MissLedger(CHIP, warn_once)
    for n in (1, 2, 3):
        book.note("default", "add", {"n": n}, "float32")
    return book


def refusal(field: str) -> ServerRefusedError:
    """The error the client's call raises for the server's 422 naming ``field``."""
    return ServerRefusedError("/v1/misses", 422, ErrorBody(code="invalid", message="refused", field=field))


def sizes(misses: MissesCreate | None) -> list[int]:
    return sorted(miss.shape["n"] for miss in misses.misses) if misses is not None else []


def test_a_refused_key_is_dropped_for_good_and_the_others_are_sent_at_once() -> None:
    book = ledger()
    sent = book.take()
    assert sizes(sent) == [1, 2, 3]
    assert sent is not None
    refused = next(i for i, miss in enumerate(sent.misses) if miss.shape["n"] == 2)
    assert book.failed(sent, refusal(f"misses[{refused}].shape.n"))
    assert sizes(book.take()) == [1, 3]
    book.note("default", "add", {"n": 2}, "float32")
    assert book.take() is None, "a key the server refused is never counted again"


def test_a_refused_count_drops_that_entry_once_and_never_the_key() -> None:
    book = ledger()
    sent = book.take()
    assert sent is not None
    assert book.failed(sent, refusal("misses[0].count"))
    assert len(sizes(book.take())) == 2
    book.note("default", "add", {"n": sent.misses[0].shape["n"]}, "float32")
    assert sizes(book.take()) == [sent.misses[0].shape["n"]], "still counted"


def test_a_refused_chip_drops_the_report_and_refuses_no_key() -> None:
    book = ledger()
    sent = book.take()
    assert sent is not None
    assert not book.failed(sent, refusal("misses[1].chip"))
    assert book.take() is None
    book.note("default", "add", {"n": 1}, "float32")
    assert sizes(book.take()) == [1], "no key was refused for good"


# -- at interpreter exit, in a real process --------------------------------------------------------

#: A short script that never closes its client: two keys nobody tuned, ``flushes`` reports by hand
#: (each followed by one more key), then it prints when its body ended and exits.
EXIT_SCRIPT = """\
import logging, sys, time
from tiletune.client import ClientSettings, ConfigClient

logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
url, chip, token, flushes = sys.argv[1], sys.argv[2], sys.argv[3] or None, int(sys.argv[4])
client = ConfigClient(url, chip, token=token, settings=ClientSettings(cache_dir=None, miss_flush_s=3600.0))
for n in (5000, 6000):
    assert client.get("add", {"n": n}).match == "default"
for extra in range(flushes):
    client.flush_misses()
    client.get("add", {"n": 7000 + extra})
print(time.monotonic(), flush=True)
"""


@dataclass
class Exited:
    """A run of :data:`EXIT_SCRIPT`: its exit status, its log, and the seconds its exit took."""

    returncode: int
    stderr: str
    exit_s: float


def run_exit_script(url: str, token: str | None, flushes: int = 0) -> Exited:
    """Run :data:`EXIT_SCRIPT` against ``url`` (the monotonic clock is the machine's: the seconds from
    the end of the script's body to its exit are read across the processes)."""
    command = [sys.executable, "-c", EXIT_SCRIPT, url, CHIP, token or "", str(flushes)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    ended = time.monotonic()
    assert result.returncode == 0, result.stderr
    return Exited(result.returncode, result.stderr, ended - float(result.stdout.split()[-1]))


def test_a_script_that_never_closes_its_client_reports_its_misses_at_exit(server: LiveServer) -> None:
    exited = run_exit_script(server.url, ADMIN_TOKEN)

    listed = httpx.get(f"{server.url}/v1/misses").json()
    assert {row["shape_key"]: row["count"] for row in listed} == {"n=5000": 1, "n=6000": 1}
    assert exited.exit_s < EXIT_REPORT_S
    metrics = httpx.get(f"{server.url}/metrics", headers=ADMIN).text
    assert 'tiletune_client_answers_total{answer="default"} 2.0' in metrics, "the stats too"


def test_a_script_exits_promptly_when_the_server_is_down() -> None:
    exited = run_exit_script(f"http://127.0.0.1:{free_port()}", ADMIN_TOKEN)
    assert exited.exit_s < 2.0, exited.stderr
    assert "not reported at exit" in exited.stderr


def test_a_silent_server_holds_the_exit_no_longer_than_the_reports_deadline() -> None:
    """A server that takes the connection and never answers: each report would wait its whole
    ``report_timeout_s`` (5 s, misses then stats); the exit waits :data:`EXIT_REPORT_S` in all."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        started = time.monotonic()
        exited = run_exit_script(f"http://127.0.0.1:{silent.getsockname()[1]}", ADMIN_TOKEN)
    assert EXIT_REPORT_S - 0.5 < exited.exit_s < EXIT_REPORT_S + 2.0, exited.stderr
    assert time.monotonic() - started < 10.0


#: :data:`EXIT_SCRIPT` for the async client: its loop is closed before the interpreter exits.
ASYNC_EXIT_SCRIPT = """\
import asyncio, sys
from tiletune.client import AsyncConfigClient, ClientSettings

async def main() -> None:
    settings = ClientSettings(cache_dir=None, miss_flush_s=3600.0)
    client = AsyncConfigClient(sys.argv[1], sys.argv[2], token=sys.argv[3], settings=settings)
    for n in (5000, 6000):
        assert (await client.get("add", {"n": n})).match == "default"

asyncio.run(main())
"""


def test_an_async_client_never_closed_reports_its_misses_at_exit_after_its_loop(server: LiveServer) -> None:
    command = [sys.executable, "-c", ASYNC_EXIT_SCRIPT, server.url, CHIP, ADMIN_TOKEN]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    listed = httpx.get(f"{server.url}/v1/misses").json()
    assert {row["shape_key"]: row["count"] for row in listed} == {"n=5000": 1, "n=6000": 1}


def test_a_client_without_a_token_says_once_what_to_set(server: LiveServer) -> None:
    """The server takes miss reports from token holders only: three reports refused (two by hand,
    one at exit), one warning naming what to set; the refused misses are dropped."""
    exited = run_exit_script(server.url, None, flushes=2)

    warnings = [line for line in exited.stderr.splitlines() if "TILETUNE_TOKEN" in line]
    assert len(warnings) == 1, exited.stderr
    assert warnings[0].startswith("WARNING tiletune.client: tiletune server refused a miss report")
    assert "token=" in warnings[0]
    assert httpx.get(f"{server.url}/v1/misses").json() == []
