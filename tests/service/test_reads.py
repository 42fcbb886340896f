"""Contract suite of the fast read path: the in-memory index of best configs and the cached export.

Runs the real app on SQLite and PostgreSQL (``database_url``). What it holds to
(:mod:`tiletune.service.index`, :mod:`tiletune.service.exports`): exact lookups answer what
the database holds; a promotion or an import in this replica is seen by the next request;
one made by another replica over the same PostgreSQL store within ``2 * index_check_s`` (plus
a refresh), even when its transaction commits after a later one; the export's ETag changes
exactly when the bundle does, a matching ``If-None-Match`` is a 304 without a body, the gzip
body is the identity body compressed; concurrent requests build one export and one refresh.
"""

from __future__ import annotations

import asyncio
import gzip
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tests.bundles import SOFTWARE, sealed
from tests.credentials import ADMIN, ADMIN_SECRET
from tiletune.client.wire import BestConfigPublic, ConfigBundle, LookupPublic
from tiletune.kernels import DeviceLimits, get_kernel
from tiletune.service import configs
from tiletune.service.app import Services, create_app
from tiletune.service.configs import JobKey, Winner
from tiletune.service.entries import entry_best
from tiletune.service.fleet import chip_by_name
from tiletune.service.lookup import lookup
from tiletune.service.migrate import upgrade
from tiletune.service.settings import Settings

from .conftest import postgres_database

CHIP_NAME = "cpu/Test Chip (AVX2)/2c"
CHIP = {"name": CHIP_NAME, "kind": "cpu", "local_memory_bytes": 1 << 20}
OTHER_CHIP_NAME = "cpu/Other Chip/4c"
OTHER_CHIP = {"name": OTHER_CHIP_NAME, "kind": "cpu", "local_memory_bytes": 1 << 20}
LIMITS = DeviceLimits(local_memory_bytes=1 << 20)
#: The other replica's check interval in these tests (seconds).
CHECK_S = 0.2
#: Scheduling slack on a busy 2-core machine, over the documented ``2 * CHECK_S`` plus a refresh.
SLACK_S = 2.0

Start = Callable[..., TestClient]


def services(client: TestClient) -> Services:
    app: FastAPI = client.app  # type: ignore[assignment]
    found: Services = app.state.services
    return found


@pytest.fixture
def start(database_url: str) -> Iterator[Start]:
    """Starts replicas of the app on the test's database (each its own engines, index and caches)."""
    upgrade(database_url)
    with ExitStack() as stack:

        def replica(**overrides: Any) -> TestClient:
            settings = Settings(db_url=database_url, admin_token=ADMIN_SECRET, **overrides)
            client = TestClient(create_app(settings, reaper=False), headers=ADMIN)
            return stack.enter_context(client)

        yield replica


@pytest.fixture
def client(start: Start) -> TestClient:
    client = start()
    register(client, CHIP)
    register(client, OTHER_CHIP)
    return client


def register(client: TestClient, chip: dict[str, Any]) -> None:
    body = {"name": "w", "chip": chip, "backends": ["torch"], "software": {"torch": "2.13.0"}}
    assert client.post("/v1/workers", json=body).status_code == 201


def entry(kernel: str, shape: dict[str, int], *, chip: str = CHIP_NAME, ms: float = 1.0) -> dict[str, Any]:
    """A bundle entry of a valid config (the kernel's default rule, so valid on the chip)."""
    spec = get_kernel(kernel)
    return {
        "kernel": spec.name,
        "kernel_version": spec.version,
        "shape": shape,
        "shape_key": spec.canonical_shape(shape),
        "dtype": "float32",
        "chip": chip,
        "config": spec.default_config(shape, "float32", LIMITS),
        "median_ms": ms,
        "default_ms": 2.0 * ms,
        "promoted_at": datetime(2026, 1, 1, tzinfo=UTC).isoformat(),
        "software": SOFTWARE,
    }


def import_entries(client: TestClient, *entries: dict[str, Any]) -> None:
    response = client.post("/v1/configs/import", json=sealed(*entries))
    assert response.status_code == 200, response.text


def exact(client: TestClient, kernel: str, shape: str, chip: str = CHIP_NAME) -> httpx.Response:
    response: httpx.Response = client.get(
        f"/v1/configs/{kernel}", params={"shape": shape, "chip": chip, "match": "exact"}
    )
    return response


def export(client: TestClient, chip: str = CHIP_NAME, **headers: str) -> httpx.Response:
    response: httpx.Response = client.get("/v1/configs", params={"chip": chip}, headers=headers)
    return response


def matmul_text(m: int, n: int, k: int) -> str:
    """A matmul shape as text, its dims in another order than the spec's (the lookup canonicalises)."""
    return f"k={k},n={n},m={m}"


MATMULS = [(64 * i, 64, 32 * j) for i in range(1, 4) for j in range(1, 4)]
ADDS = [1024 * i for i in range(1, 6)]


def fill(client: TestClient) -> None:
    import_entries(
        client,
        *(entry("matmul", {"m": m, "n": n, "k": k}) for m, n, k in MATMULS),
        *(entry("add", {"n": n}, ms=0.5 + n / 1e4) for n in ADDS),
        entry("add", {"n": 4096}, chip=OTHER_CHIP_NAME, ms=3.0),
    )


def test_exact_lookups_answer_what_the_database_holds(client: TestClient) -> None:
    fill(client)
    assert exact(client, "add", "n=1024").status_code == 200
    assert indexed(client) == in_database(client)
    assert len(indexed(client)) == len(MATMULS) + len(ADDS) + 1
    db = services(client).db
    asked = [("matmul", matmul_text(m, n, k)) for m, n, k in MATMULS] + [("add", f"n={n}") for n in ADDS]
    for kernel, shape in asked:
        response = exact(client, kernel, shape)
        assert response.status_code == 200, response.text
        assert response.headers["content-type"] == "application/json"
        served = LookupPublic.model_validate_json(response.content)
        stored = lookup(db, kernel, shape, dtype="float32", chip=CHIP_NAME, match="exact")
        assert served == stored
        assert served.match == "exact"
        assert list(served.shape) == [dim.name for dim in get_kernel(kernel).dims]  # parsed, spec order
    other = LookupPublic.model_validate_json(exact(client, "add", "n=4096", OTHER_CHIP_NAME).content)
    assert other.best is not None
    assert other.best.median_ms == 3.0
    assert exact(client, "add", "n=999").status_code == 404  # not tuned: the DB path, as before
    assert client.get("/v1/configs/add", params={"shape": "n=999", "chip": CHIP_NAME}).json()["match"] in (
        "nearest",
        "default",
    )
    bad = exact(client, "add", "n=abc")
    assert bad.status_code == 422
    assert bad.json()["field"] is not None
    wrong_match = client.get("/v1/configs/add", params={"shape": "n=1024", "chip": CHIP_NAME, "match": "x"})
    assert wrong_match.status_code == 422
    assert wrong_match.json()["field"] == "match"


def test_an_import_or_a_promotion_in_this_replica_is_seen_by_the_next_request(client: TestClient) -> None:
    assert exact(client, "add", "n=2048").status_code == 404
    import_entries(client, entry("add", {"n": 2048}, ms=1.0))
    first = LookupPublic.model_validate_json(exact(client, "add", "n=2048").content)
    assert indexed(client) == in_database(client)
    assert first.best is not None
    assert first.best.median_ms == 1.0

    db = services(client).db
    spec = get_kernel("add")
    with db.write() as session:
        chip = chip_by_name(session, CHIP_NAME)
        assert chip is not None
        key = JobKey(spec.name, spec.version, "n=2048", "float32", chip.id)
        faster = {**spec.default_config({"n": 2048}, "float32", LIMITS), "buffer_num": 3}
        configs.promote(session, key, Winner({"n": 2048}, faster, 0.25), db.clock())
    second = LookupPublic.model_validate_json(exact(client, "add", "n=2048").content)
    assert indexed(client) == in_database(client)
    assert second.config == faster
    assert second.best is not None
    assert second.best.median_ms == 0.25


def promote_key(client: TestClient, session: Any, n: int, ms: float) -> None:
    spec = get_kernel("add")
    chip = chip_by_name(session, CHIP_NAME)
    assert chip is not None
    key = JobKey(spec.name, spec.version, f"n={n}", "float32", chip.id)
    config = spec.default_config({"n": n}, "float32", LIMITS)
    configs.promote(session, key, Winner({"n": n}, config, ms), services(client).db.clock())


def indexed(client: TestClient) -> dict[tuple[str, int, str, str, str], BestConfigPublic]:
    """What the replica's index holds now."""
    snapshot = services(client).reads.index.snapshot
    assert snapshot is not None
    return {key: entry_best(entry) for key, entry in snapshot.entries.items()}


def in_database(client: TestClient) -> dict[tuple[str, int, str, str, str], BestConfigPublic]:
    """What the database holds, every chip."""
    with services(client).db.read() as session:
        bests = [b for chip in (CHIP, OTHER_CHIP) for b in configs.best_configs(session, str(chip["name"]))]
    return {(b.kernel, b.kernel_version, b.shape_key, b.dtype, b.chip): b for b in bests}


def wait_for_ms(client: TestClient, shape: str, ms: float) -> float:
    """Seconds until ``client``'s index holds ``shape`` at ``median_ms == ms`` (fails after the bound).

    Asks through the route, which keeps the index current (the request path or the watcher).
    """
    key = ("add", 1, shape, "float32", CHIP_NAME)
    started = time.monotonic()
    while time.monotonic() - started < 2 * CHECK_S + SLACK_S:
        response = exact(client, "add", shape)
        found = indexed(client).get(key)
        if found is not None and found.median_ms == ms:
            assert response.json()["best"]["median_ms"] == ms
            return time.monotonic() - started
        time.sleep(0.02)
    raise AssertionError(f"{shape} at {ms} ms not seen within {2 * CHECK_S + SLACK_S:g} s")


@pytest.mark.parametrize("watched", [True, False], ids=["watcher", "lazy"])
def test_another_replica_s_changes_are_seen_within_the_bound(watched: bool) -> None:
    with postgres_database() as url, ExitStack() as stack:
        upgrade(url)
        settings = Settings(db_url=url, admin_token=ADMIN_SECRET, index_check_s=CHECK_S)
        writer = stack.enter_context(TestClient(create_app(settings, reaper=False), headers=ADMIN))
        reader = TestClient(create_app(settings, reaper=False), headers=ADMIN)
        if watched:
            stack.enter_context(reader)  # the lifespan runs the index's background check
        register(writer, CHIP)
        assert exact(reader, "add", "n=8192").status_code == 404  # the reader's index is loaded now

        import_entries(writer, entry("add", {"n": 8192}, ms=1.5))
        wait_for_ms(reader, "n=8192", 1.5)

        # PostgreSQL draws ids before commit: a promotion may become visible after a later one.
        early = services(writer).db.sessions()
        with early.begin():
            promote_key(writer, early, 16384, 0.75)  # id drawn first, committed last
            with services(writer).db.write() as session:
                promote_key(writer, session, 32768, 0.5)
            wait_for_ms(reader, "n=32768", 0.5)
            assert exact(reader, "add", "n=16384").status_code == 404
            assert ("add", 1, "n=16384", "float32", CHIP_NAME) not in indexed(reader)
        early.close()
        wait_for_ms(reader, "n=16384", 0.75)
        if not watched:
            reader.close()


def test_the_export_is_the_database_s_bundle_in_both_encodings(client: TestClient) -> None:
    fill(client)
    plain = export(client, **{"Accept-Encoding": "identity"})
    assert plain.status_code == 200
    assert "content-encoding" not in plain.headers
    bundle = ConfigBundle.model_validate_json(plain.content)
    assert bundle.checksum == bundle.content_checksum()
    assert bundle.chip == CHIP_NAME
    assert bundle.exported_at is not None
    assert {info.name for info in bundle.kernels} >= {"add", "matmul"}
    with services(client).db.read() as session:
        stored = configs.best_configs(session, CHIP_NAME)
    key = lambda e: (e.kernel, e.kernel_version, e.shape_key, e.dtype)  # noqa: E731
    assert sorted(bundle.configs, key=key) == sorted(stored, key=key)
    assert len(bundle.configs) == len(MATMULS) + len(ADDS)

    with client.stream("GET", "/v1/configs", params={"chip": CHIP_NAME}) as zipped:
        assert zipped.headers["content-encoding"] == "gzip"
        assert zipped.headers["etag"] != plain.headers["etag"]  # one strong ETag per representation
        assert gzip.decompress(b"".join(zipped.iter_raw())) == plain.content

    one = client.get("/v1/configs", params={"chip": CHIP_NAME, "kernel": "matmul"})
    assert {e.kernel for e in ConfigBundle.model_validate_json(one.content).configs} == {"matmul"}
    assert [info.name for info in ConfigBundle.model_validate_json(one.content).kernels] == ["matmul"]
    empty = ConfigBundle.model_validate_json(export(client, "cpu/nobody").content)
    assert empty.configs == []
    assert empty.checksum == empty.content_checksum()


def test_the_etag_changes_exactly_when_the_bundle_changes(client: TestClient) -> None:
    fill(client)
    first = export(client)
    etag = first.headers["etag"]
    assert export(client).headers["etag"] == etag

    revalidated = export(client, **{"If-None-Match": etag})
    assert revalidated.status_code == 304
    assert revalidated.content == b""
    assert revalidated.headers["etag"] == etag
    plain_tag = export(client, **{"Accept-Encoding": "identity"}).headers["etag"]
    assert export(client, **{"If-None-Match": plain_tag}).status_code == 304  # either representation
    assert export(client, **{"If-None-Match": f'"other", W/{etag}'}).status_code == 304
    assert export(client, **{"If-None-Match": '"other"'}).status_code == 200

    import_entries(client, entry("add", {"n": 77777}, chip=OTHER_CHIP_NAME))  # another chip's
    unchanged = export(client, **{"If-None-Match": etag})
    assert unchanged.status_code == 304
    assert export(client).content == first.content  # same bytes: same exported_at too

    import_entries(client, entry("add", {"n": 1024}, ms=0.01))  # faster: this chip's bundle changes
    changed = export(client, **{"If-None-Match": etag})
    assert changed.status_code == 200
    assert changed.headers["etag"] != etag
    faster = [e for e in ConfigBundle.model_validate_json(changed.content).configs if e.shape_key == "n=1024"]
    assert faster[0].median_ms == 0.01


def test_concurrent_requests_build_one_export_and_one_refresh(start: Start) -> None:
    client = start(index_check_s=3600)  # the index's background check never runs during the test
    register(client, CHIP)
    register(client, OTHER_CHIP)
    fill(client)
    reads = services(client).reads
    app = client.app

    async def storm() -> tuple[list[httpx.Response], list[httpx.Response]]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", headers=ADMIN) as http:
            refreshes, builds = reads.index.reloads + reads.index.changes, reads.exports.builds
            import_response = await http.post("/v1/configs/import", json=sealed(entry("add", {"n": 6144})))
            assert import_response.status_code == 200
            # The import applied its change to the index before it answered: no lookup waits.
            assert reads.index.reloads + reads.index.changes == refreshes + 1
            params = {"shape": "n=6144", "chip": CHIP_NAME, "match": "exact"}
            lookups = await asyncio.gather(*(http.get("/v1/configs/add", params=params) for _ in range(40)))
            assert reads.index.reloads + reads.index.changes == refreshes + 1
            # A change the index has not applied (its writer's refresh failed): one refresh for all.
            reads.db.generation += 1
            before = reads.index.refreshes
            stale = await asyncio.gather(*(http.get("/v1/configs/add", params=params) for _ in range(40)))
            assert reads.index.refreshes == before + 1
            assert {r.content for r in stale} == {r.content for r in lookups}
            exports = await asyncio.gather(
                *(http.get("/v1/configs", params={"chip": CHIP_NAME}) for _ in range(40))
            )
            assert reads.exports.builds == builds + 1
            return lookups, exports

    lookups, exports = asyncio.run(storm())
    assert {r.status_code for r in lookups} == {200}
    assert len({r.content for r in lookups}) == 1
    assert {r.status_code for r in exports} == {200}
    assert len({r.headers["etag"] for r in exports}) == 1
    assert any(e.shape_key == "n=6144" for e in ConfigBundle.model_validate_json(exports[0].content).configs)
