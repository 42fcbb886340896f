"""Miss reports: one key the server will not take never costs the others.

End to end, the sync client against the app of ``conftest.server`` (uvicorn on a thread,
SQLite, threshold 3, the chip registered): a legal key too large to tune is counted with the
others, report after report. Then the client's own account of refusals (:class:`MissLedger`,
with the errors its calls raise) for each kind of field a 422 may name.
"""

from __future__ import annotations

import logging
from pathlib import Path

import httpx

from tests.credentials import ADMIN_TOKEN
from tiletune.client import ClientSettings, ConfigClient
from tiletune.client.calls import ServerRefusedError
from tiletune.client.misses import MissLedger
from tiletune.client.wire import ErrorBody, MissesCreate
from tiletune.kernels import client_settings

from .conftest import CHIP, LiveServer

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
