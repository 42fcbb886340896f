"""CSV downloads never hand a spreadsheet a formula, whatever names readers, submitters and workers chose.

A reader reports misses on a chip it names, and a worker registers under names it chooses: both
reach dashboard tables (the misses, the overview's workers and coverage) and their downloads.
Every text cell a spreadsheet would run (``=``, ``+``, ``-``, ``@``, tab, carriage return first)
starts with a single quote; numbers stay numbers. In process, on a store of its own.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.credentials import ADMIN, ADMIN_SECRET
from tiletune.service.app import create_app
from tiletune.service.dashboard.tables import Column, Table, download
from tiletune.service.migrate import upgrade
from tiletune.service.settings import Settings

#: Names a spreadsheet would run as formulas (the wire refuses tabs and carriage returns in names).
FORMULAS = ('=HYPERLINK("https://evil.example","x")', "+1+cmd|' /C calc'!A0", "-2+3", "@SUM(A1:A9)")


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    """The app on a store of its own (demand tuning off), called with the admin token."""
    url = f"sqlite:///{tmp_path / 'csv.db'}"
    upgrade(url)
    settings = Settings(db_url=url, admin_token=ADMIN_SECRET, miss_queue_threshold=0)
    with TestClient(create_app(settings, reaper=False), headers=ADMIN) as client:
        yield client


def token_of(client: TestClient, role: str) -> dict[str, str]:
    """Headers of a new token of ``role``."""
    created = client.post("/v1/tokens", json={"role": role, "name": f"csv-{role}"})
    assert created.status_code == 201, created.text
    return {"Authorization": f"Bearer {created.json()['token']}"}


def csv_rows(client: TestClient, path: str, **params: str) -> list[list[str]]:
    """The rows of a page's CSV download, header first."""
    answer = client.get(path, params={"format": "csv", **params})
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/csv")
    return list(csv.reader(io.StringIO(answer.text)))


def test_a_readers_chip_names_download_as_text_not_formulas(client: TestClient) -> None:
    reader = token_of(client, "reader")
    misses = [
        {"kernel": "add", "shape": {"n": 1024}, "dtype": "float32", "chip": name, "match": "default"}
        for name in FORMULAS
    ]
    assert client.post("/v1/misses", json={"misses": misses}, headers=reader).status_code == 200

    header, *rows = csv_rows(client, "/misses")
    chips = [row[header.index("chip")] for row in rows]
    assert sorted(chips) == sorted("'" + name for name in FORMULAS)
    assert {row[header.index("count")] for row in rows} == {"1"}  # numbers stay numbers

    coverage = csv_rows(client, "/", table="coverage")[0]  # its columns are the chips
    assert sorted(coverage[1:]) == sorted("'" + name for name in FORMULAS)


def test_a_workers_names_download_as_text_not_formulas(client: TestClient) -> None:
    worker = token_of(client, "worker")
    chip = {"name": "@chip", "kind": "cpu", "local_memory_bytes": 1 << 20}
    body = {"name": "=1+2", "chip": chip, "backends": ["torch"], "software": {"torch": "2.13.0"}}
    assert client.post("/v1/workers", json=body, headers=worker).status_code == 201

    header, row = csv_rows(client, "/", table="workers")
    assert row[header.index("name")] == "'=1+2"
    assert row[header.index("chip")] == "'@chip"
    assert row[header.index("id")] == "1"


def test_numbers_and_plain_negative_numbers_stay_as_they_are() -> None:
    columns = [Column("value", "Value")]
    values = [-1.5, -3, 0.25, "-3", "-0.5e-3", "+7", "-", "-1-1", "\tx", "\rx", "a=b", "x-1", "", None]
    table = Table("t", columns, [{"value": value} for value in values])
    body = download(table, "csv").body
    assert isinstance(body, bytes)
    cells = [row[0] for row in csv.reader(io.StringIO(body.decode()))][1:]
    assert cells == [
        "-1.5",
        "-3",
        "0.25",
        "-3",
        "-0.5e-3",
        "+7",
        "'-",
        "'-1-1",
        "'\tx",
        "'\rx",
        "a=b",
        "x-1",
        "",
        "",
    ]
