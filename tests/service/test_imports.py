"""Imports hold every entry to what the server accepts elsewhere: software as workers register it,
the default config as a config on the entry's chip. On SQLite and PostgreSQL through the real app.

Each bundle here is sealed (its checksum matches), so a refusal is the entry's; a refused import
answers 422 naming the entry's field and changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from tests.bundles import SOFTWARE, resealed, sealed
from tests.credentials import ADMIN, ADMIN_SECRET
from tests.service.conftest import postgres_database, snapshot
from tiletune.service.app import create_app
from tiletune.service.configs import ANALYZE_AFTER
from tiletune.service.database import normalize_url
from tiletune.service.migrate import upgrade
from tiletune.service.settings import Settings

CHIP = {"name": "cpu/Import Test Chip", "kind": "cpu", "local_memory_bytes": 1 << 20}
#: A chip of one buffer per queue: the add kernel's own default rule (two buffers) cannot run on it.
ONE_BUFFER_CHIP = {
    "name": "cpu/One Buffer Chip",
    "kind": "cpu",
    "local_memory_bytes": 1 << 20,
    "max_buffer_num": 1,
}
ADD = {"tile_size": 4096, "buffer_num": 2, "pipeline_depth": 2}
#: The add kernel's default rule for n=65536 on :data:`CHIP` (and on :data:`ONE_BUFFER_CHIP`).
ADD_RULE = {"tile_size": 256, "buffer_num": 2, "pipeline_depth": 2}
#: In the add kernel's space for n=65536, but its working set (3 MiB) exceeds the chip's 1 MiB.
TOO_BIG_FOR_CHIP = {"tile_size": 65536, "buffer_num": 4, "pipeline_depth": 2}
MEGABYTE = 1 << 20


@pytest.fixture
def client(database_url: str) -> Iterator[tuple[TestClient, str]]:
    upgrade(database_url)
    settings = Settings(db_url=database_url, admin_token=ADMIN_SECRET)
    with TestClient(create_app(settings, reaper=False), headers=ADMIN) as test_client:
        for chip in (CHIP, ONE_BUFFER_CHIP):
            worker = test_client.post("/v1/workers", json={"name": "w", "chip": chip, "backends": ["torch"]})
            assert worker.status_code == 201, worker.text
        yield test_client, database_url


def entry(n: int, **fields: Any) -> dict[str, Any]:
    """A good entry of the add kernel for shape n (on :data:`CHIP` unless ``fields`` say otherwise)."""
    return {
        "kernel": "add",
        "kernel_version": 1,
        "shape": {"n": n},
        "shape_key": f"n={n}",
        "dtype": "float32",
        "chip": CHIP["name"],
        "config": ADD,
        "median_ms": 1.0,
        "promoted_at": datetime.now(UTC).isoformat(),
        "software": SOFTWARE,
        **fields,
    }


def refused_fourth(client: tuple[TestClient, str], bad: dict[str, Any]) -> dict[str, Any]:
    """Import three good entries and ``bad`` (``configs[3]``) in one sealed bundle: the refusal's body.

    Asserts the refusal is 422 and the database is as it was.
    """
    app, url = client
    before = snapshot(url)
    good = [entry(n) for n in (4096, 8192, 16384)]
    response = app.post("/v1/configs/import", json=sealed(*good, bad))
    assert response.status_code == 422, response.text
    assert snapshot(url) == before
    body: dict[str, Any] = response.json()
    assert set(body) == {"code", "message", "field"}
    assert len(body["message"]) < 500  # never what was sent
    return body


HOSTILE_SOFTWARE = {
    "nul": {"torch": "2.13.0\x00evil"},
    "bidi": {"torch": "2.13.0\u202egnp.exe"},
    "escape": {"torch": "\x1b[2J2.13.0"},
    "megabyte": {"torch": "9" * MEGABYTE},
    "too_many_packages": {f"package_{i}": "1.0" for i in range(33)},
    "bad_name": {"torch\u202e": "2.13.0"},
    "long_name": {"p" * 65: "1.0"},
    "too_long_to_store": {f"package_{i}": "1" * 200 for i in range(32)},  # each part in bounds
}


@pytest.mark.parametrize("software", HOSTILE_SOFTWARE.values(), ids=HOSTILE_SOFTWARE.keys())
def test_software_is_bounded_as_a_workers_registration_bounds_it(
    client: tuple[TestClient, str], software: dict[str, str]
) -> None:
    body = refused_fourth(client, entry(32768, software=software))

    assert body["field"] == "configs[3].software"
    assert body["code"] == "invalid"


def test_the_same_software_is_refused_at_a_workers_registration(client: tuple[TestClient, str]) -> None:
    """The bound the import applies is the registration's own: both refuse the same fingerprints
    (but the megabyte, which is over the registration's body cap before any fingerprint is read)."""
    app, _ = client
    for name, software in HOSTILE_SOFTWARE.items():
        if name == "megabyte":
            continue
        worker = {"name": "w", "chip": CHIP, "backends": ["torch"], "software": software}
        assert app.post("/v1/workers", json=worker).status_code == 422, name


def test_a_default_config_that_cannot_run_on_the_chip_is_refused(client: tuple[TestClient, str]) -> None:
    body = refused_fourth(client, entry(65536, default_config=TOO_BIG_FOR_CHIP, default_ms=2.0))

    assert body["field"] == "configs[3].default_config"
    assert "exceeds local memory" in body["message"]


def test_a_default_config_outside_the_kernels_space_names_its_knob(client: tuple[TestClient, str]) -> None:
    body = refused_fourth(client, entry(65536, default_config={**ADD, "tile_size": 3}))

    assert body["field"] == "configs[3].default_config.tile_size"


def test_the_kernels_own_default_rule_is_taken_even_where_the_chip_refuses_it(
    client: tuple[TestClient, str],
) -> None:
    """What this server records as a job's default on such a chip, so its own export imports again."""
    app, _ = client
    one_buffer = {**ADD, "buffer_num": 1, "pipeline_depth": 1}
    rule = entry(65536, chip=ONE_BUFFER_CHIP["name"], config=one_buffer, default_config=ADD_RULE)

    imported = app.post("/v1/configs/import", json=sealed(rule))

    assert imported.json() == {"changed": 1}, imported.text
    exported = app.get("/v1/configs", params={"chip": ONE_BUFFER_CHIP["name"]}).json()
    assert [e["default_config"] for e in exported["configs"]] == [ADD_RULE]


def test_a_good_bundle_imports_and_its_export_imports_again(client: tuple[TestClient, str]) -> None:
    app, _ = client
    entries = [entry(n, default_config=ADD_RULE, default_ms=2.0) for n in (4096, 65536)]
    assert app.post("/v1/configs/import", json=sealed(*entries)).json() == {"changed": 2}

    exported = app.get("/v1/configs", params={"chip": CHIP["name"]}).json()
    again = app.post("/v1/configs/import", params={"force": "true"}, json=exported)

    assert again.status_code == 200, again.text
    assert again.json() == {"changed": 0}  # not faster than what is there


def test_the_checksum_is_still_checked(client: tuple[TestClient, str]) -> None:
    app, url = client
    before = snapshot(url)
    bundle = sealed(entry(4096))
    bundle["configs"][0]["median_ms"] = 0.5  # changed after sealing

    refused = app.post("/v1/configs/import", json=bundle)

    assert refused.status_code == 422
    assert refused.json()["field"] == "checksum"
    assert snapshot(url) == before
    assert app.post("/v1/configs/import", json=resealed(bundle)).json() == {"changed": 1}


def test_a_large_import_refreshes_the_planners_statistics_on_postgresql() -> None:
    """A bundle of ``ANALYZE_AFTER`` new keys leaves statistics that count them (the planner
    scanned whole tables for the next bundle's reads with the statistics from before)."""
    with postgres_database() as url:
        upgrade(url)
        settings = Settings(db_url=url, admin_token=ADMIN_SECRET)
        with TestClient(create_app(settings, reaper=False), headers=ADMIN) as app:
            worker = app.post("/v1/workers", json={"name": "w", "chip": CHIP, "backends": ["torch"]})
            assert worker.status_code == 201, worker.text
            entries = [entry(1024 + 16 * i, config=ADD_RULE) for i in range(ANALYZE_AFTER)]
            response = app.post("/v1/configs/import", json=sealed(*entries))
            assert response.status_code == 200, response.text
            assert response.json() == {"changed": ANALYZE_AFTER}
        engine = create_engine(normalize_url(url))
        try:
            with engine.connect() as connection:
                counted = connection.execute(
                    text("SELECT reltuples FROM pg_class WHERE relname = 'best_configs'")
                ).scalar_one()
        finally:
            engine.dispose()
    assert counted == ANALYZE_AFTER
