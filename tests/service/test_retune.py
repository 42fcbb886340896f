"""Contract suite of re-tuning after a software change (``tiletune.service.demand.retune`` states it) and of
the launches per key it ranks stale keys by (``tiletune.service.demand.key_usage``).

Runs the real app on SQLite and PostgreSQL (``database_url``) with a manual clock; the test plays
the workers that register (torch 2.13, then 2.14), the clients whose lookups and stats count
launches, and the worker that runs a re-tuning job through the lease protocol.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from tests.credentials import ADMIN, ADMIN_SECRET
from tiletune.kernels import DeviceLimits, get_kernel
from tiletune.service import configs
from tiletune.service.app import Services, create_app
from tiletune.service.configs import JobKey, Winner
from tiletune.service.fleet import chip_by_name, newest_software_id
from tiletune.service.migrate import upgrade
from tiletune.service.models import KeyUsageRow, RetuneRow, SoftwareRow
from tiletune.service.settings import Settings

from .conftest import ManualClock
from .test_protocol import held, lease, measurement, tell

CHIP = {"name": "cpu/Test Chip (AVX2)/2c", "kind": "cpu", "local_memory_bytes": 1 << 20}
OLD, NEW = "2.13.0", "2.14.0"
LIMITS = DeviceLimits(local_memory_bytes=1 << 20)
SIZES = [1024, 2048, 4096, 8192, 16384, 32768]

Serve = Callable[..., TestClient]


@pytest.fixture
def serve(database_url: str, clock: ManualClock) -> Iterator[Serve]:
    """Starts the app on the test's database (no demand, 3 trials a job, ``overrides``)."""
    upgrade(database_url)
    with ExitStack() as stack:

        def start(**overrides: Any) -> TestClient:
            fields: dict[str, Any] = {"miss_queue_threshold": 0, "miss_trials": 3, **overrides}
            settings = Settings(db_url=database_url, admin_token=ADMIN_SECRET, **fields)
            return stack.enter_context(
                TestClient(create_app(settings, clock=clock, reaper=False), headers=ADMIN)
            )

        yield start


def services(client: TestClient) -> Services:
    found: Services = client.app.state.services  # type: ignore[attr-defined]
    return found


def register(client: TestClient, torch: str) -> int:
    body = {"name": "w", "chip": CHIP, "backends": ["torch"], "software": {"torch": torch}}
    response = client.post("/v1/workers", json=body)
    assert response.status_code == 201, response.text
    worker_id: int = response.json()["id"]
    return worker_id


def incumbent(n: int) -> dict[str, int]:
    """The best promoted under the old software: not the default rule (it must be told apart)."""
    spec = get_kernel("add")
    return {**spec.default_config({"n": n}, "float32", LIMITS), "buffer_num": 3}


def promote_all(client: TestClient, sizes: list[int]) -> None:
    """Promote a best for each size, measured with the chip's newest software (the old one)."""
    db = services(client).db
    spec = get_kernel("add")
    with db.write() as session:
        chip = chip_by_name(session, str(CHIP["name"]))
        assert chip is not None
        software = newest_software_id(session, chip.id)
        for n in sizes:
            key = JobKey(spec.name, spec.version, f"n={n}", "float32", chip.id)
            winner = Winner({"n": n}, incumbent(n), 1.0, software_id=software)
            configs.promote(session, key, winner, db.clock())


def look_up(client: TestClient, n: int, times: int = 1) -> dict[str, Any]:
    answer: dict[str, Any] = {}
    for _ in range(times):
        response = client.get("/v1/configs/add", params={"shape": f"n={n}", "chip": CHIP["name"]})
        assert response.status_code == 200, response.text
        answer = response.json()
    return answer


def client_stats(client: TestClient, counts: dict[int, int]) -> dict[str, Any]:
    keys = [{"kernel": "add", "shape": {"n": n}, "dtype": "float32", "count": c} for n, c in counts.items()]
    body = {"chip": CHIP["name"], "answers": {"exact": sum(counts.values())}, "keys": keys}
    response = client.post("/v1/client-stats", json=body)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def retuned(client: TestClient) -> dict[int, tuple[int, int]]:
    """Each re-tuned size: (its job id, the launches it was ranked by)."""
    with services(client).db.read() as session:
        rows = session.scalars(select(RetuneRow).order_by(RetuneRow.id)).all()
        return {int(row.shape_key.removeprefix("n=")): (row.job_id, row.launches) for row in rows}


def jobs(client: TestClient) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = client.get("/v1/jobs").json()
    return found


def test_a_newer_torch_queues_the_most_launched_stale_keys_within_the_budget(serve: Serve) -> None:
    client = serve(retune_budget=3)
    register(client, OLD)
    promote_all(client, SIZES)
    look_up(client, 1024, times=5)  # server lookups: 5
    assert client_stats(client, {2048: 40, 4096: 7, 16384: 1})["keys"] == 3  # clients' own launches
    look_up(client, 4096, times=2)  # 7 + 2 = 9
    miss = {
        "kernel": "add",
        "shape": {"n": 8192},
        "dtype": "float32",
        "chip": CHIP["name"],
        "match": "default",
    }
    assert client.post("/v1/misses", json={"misses": [{**miss, "count": 6}]}).status_code == 200
    assert jobs(client) == [], "nothing stale yet: no re-tuning"

    register(client, NEW)
    assert {n: launches for n, (_, launches) in retuned(client).items()} == {2048: 40, 4096: 9, 8192: 6}
    queued = jobs(client)
    assert sorted(job["shape"]["n"] for job in queued) == [2048, 4096, 8192]
    assert {job["state"] for job in queued} == {"queued"}
    assert {job["chip"] for job in queued} == {CHIP["name"]}
    with services(client).db.read() as session:
        stored = {row.shape_key: row.launches for row in session.scalars(select(KeyUsageRow))}
    assert stored == {"n=1024": 5, "n=2048": 40, "n=4096": 9, "n=16384": 1}

    register(client, NEW)  # another worker with the same software
    register(client, OLD)  # an old worker restarting: not the newest software
    assert services(client).retune.plan_pending() == []
    assert len(jobs(client)) == 3, "one software change is planned once"


def test_a_budget_of_zero_turns_retuning_off_until_it_is_turned_on(serve: Serve) -> None:
    client = serve(retune_budget=0)
    register(client, OLD)
    promote_all(client, SIZES[:2])
    register(client, NEW)
    assert jobs(client) == []
    assert services(client).retune.plan_pending() == []
    restarted = serve(retune_budget=1)
    [plan] = services(restarted).retune.plan_pending()
    assert plan.stale == 2
    assert len(plan.job_ids) == 1
    assert services(restarted).retune.plan_pending() == []


def test_a_key_with_a_live_job_is_not_queued_again(serve: Serve) -> None:
    client = serve(retune_budget=5)
    register(client, OLD)
    promote_all(client, SIZES[:2])
    sweep = {"kernel": "add", "shapes": [{"n": 1024}], "chips": [CHIP["name"]], "trials": 3}
    assert client.post("/v1/sweeps", json=sweep).status_code == 201  # skipped: tuned on the newest
    register(client, NEW)
    assert sorted(retuned(client)) == [1024, 2048]
    register(client, "2.15.0")  # the jobs queued for 2.14 are still live
    assert sorted(retuned(client)) == [1024, 2048]


def validate(
    client: TestClient,
    token: str,
    times_ms: Callable[[dict[str, int]], float],
    confirmer: int | None = None,
) -> dict[str, Any]:
    """Search until validation (synthetic times), then report the validation run at ``times_ms``.

    With a ``confirmer`` (another worker of the leader's software, online), the leader is told
    ``done`` when the search ends: it releases, and the confirmer leases the job and validates."""
    while True:
        answer = client.post("/v1/lease/ask", headers=held(token), params={"n": 2}).json()
        if answer["phase"] == "search":
            tell(client, token, answer["tasks"])
            continue
        if confirmer is not None and answer["phase"] == "done":
            released = client.post("/v1/lease/release", headers=held(token), json={"reason": "job done"})
            assert released.status_code == 200, released.text
            confirming = lease(client, confirmer)
            assert confirming is not None
            token, confirmer = confirming["token"], None
            continue
        assert answer["phase"] == "validate", answer
        finalists = answer["validate_configs"]
        results = [{"config": c, "measurement": measurement(times_ms(c))} for c in finalists]
        response = client.post("/v1/lease/complete", headers=held(token), json={"results": results})
        assert response.status_code == 200, response.text
        job: dict[str, Any] = response.json()
        return job


def test_the_old_best_is_served_until_a_new_one_beats_it_in_the_same_run(serve: Serve) -> None:
    client = serve(retune_budget=2)
    register(client, OLD)
    promote_all(client, [1024, 2048])
    worker = register(client, NEW)
    assert sorted(retuned(client)) == [1024, 2048]
    default = {n: get_kernel("add").default_config({"n": n}, "float32", LIMITS) for n in (1024, 2048)}

    first = lease(client, worker)
    assert first is not None
    n = first["job"]["shape"]["n"]
    served = look_up(client, n)
    assert served["config"] == incumbent(n), "the old best is served while its job runs"
    assert served["best"]["software"] == {"torch": OLD}
    # the old best wins the interleaved run: it stays, re-validated with the new software
    done = validate(client, first["token"], lambda c: 1.0 if c == incumbent(n) else 2.0)
    assert done["state"] == "done"
    kept = look_up(client, n)
    assert kept["config"] == incumbent(n)
    assert kept["best"]["software"] == {"torch": NEW}, "measured with the new software: current"
    assert (kept["best"]["median_ms"], kept["best"]["default_ms"]) == (1.0, 2.0), "the run's times"
    assert kept["best"]["job_id"] is None, "it keeps the job that found it"
    assert_current(client, n, done["id"])

    second = lease(client, worker)
    assert second is not None
    m = second["job"]["shape"]["n"]
    assert m != n
    # another config beats the old best in the same run: it replaces it
    times = {"old": 2.0, "default": 3.0, "other": 1.0}

    def measured(config: dict[str, int]) -> float:
        if config == incumbent(m):
            return times["old"]
        return times["default"] if config == default[m] else times["other"]

    finished = validate(client, second["token"], measured)
    assert finished["state"] == "done"
    replaced = look_up(client, m)
    assert replaced["config"] not in (incumbent(m), default[m])
    assert replaced["best"]["software"] == {"torch": NEW}
    assert replaced["best"]["job_id"] == second["job"]["id"]
    assert replaced["best"]["median_ms"] == times["other"]

    shown = client.get("/compare", params={"chip": CHIP["name"], "format": "json", "table": "retunes"})
    assert shown.status_code == 200, shown.text
    rows = {row["shape"]: row for row in shown.json()}
    assert rows[f"n={n}"]["outcome"] == "kept"
    assert (rows[f"n={n}"]["old_run_ms"], rows[f"n={n}"]["new_ms"]) == (1.0, 1.0)
    assert rows[f"n={m}"]["outcome"] == "replaced"
    assert (rows[f"n={m}"]["old_run_ms"], rows[f"n={m}"]["new_ms"]) == (times["old"], times["other"])
    assert rows[f"n={m}"]["software"] == f"torch {NEW}"
    page = client.get("/compare", params={"chip": CHIP["name"]})
    assert page.status_code == 200
    assert 'id="table-retunes"' in page.text


def assert_current(client: TestClient, n: int, job_id: int) -> None:
    """Size ``n``'s best is current: not stale on the kernel page, a sweep of it skipped (nothing
    queued again), its re-measurement in the key's history (by ``job_id``) and on the compare page."""
    rows = client.get("/kernels/add", params={"chip": CHIP["name"], "format": "json"}).json()
    assert {row["shape"]: row["stale"] for row in rows}[f"n={n}"] is None
    sweep = {"kernel": "add", "shapes": [{"n": n}], "chips": [CHIP["name"]], "trials": 3}
    created = client.post("/v1/sweeps", json=sweep)
    assert created.status_code == 201, created.text
    assert [job["state"] for job in created.json()["jobs"]] == ["skipped"]
    assert services(client).retune.plan_pending() == []
    history = client.get("/v1/history/add", params={"shape": f"n={n}", "chip": CHIP["name"]})
    assert history.status_code == 200, history.text
    points = history.json()
    assert [point["job_id"] for point in points] == [None, job_id]
    assert points[-1]["config"] == points[0]["config"] == incumbent(n)
    with services(client).db.read() as session:
        ids = session.scalars(select(SoftwareRow.id).order_by(SoftwareRow.first_seen_at)).all()
    compare = {"chip": CHIP["name"], "format": "json", "software_a": ids[0], "software_b": ids[1]}
    compared = client.get("/compare", params=compare)
    assert compared.status_code == 200, compared.text
    assert f"n={n}" in {row["shape"] for row in compared.json()}, "old and new times side by side"


def test_a_worker_with_older_software_revalidates_nothing(serve: Serve) -> None:
    client = serve(retune_budget=1)
    first = register(client, OLD)
    promote_all(client, [1024])
    register(client, NEW)
    straggler = register(client, OLD)  # a worker not upgraded yet takes the re-tuning job
    held_lease = lease(client, straggler)
    assert held_lease is not None
    # the first worker has the straggler's software: it confirms the straggler's pick
    times = lambda c: 1.0 if c == incumbent(1024) else 2.0  # noqa: E731
    done = validate(client, held_lease["token"], times, confirmer=first)
    assert done["confirmation"]["confirmed_by"] == "w"
    assert done["state"] == "done"
    kept = look_up(client, 1024)
    assert kept["config"] == incumbent(1024)
    assert (kept["best"]["software"], kept["best"]["median_ms"]) == ({"torch": OLD}, 1.0)
    rows = client.get("/kernels/add", params={"chip": CHIP["name"], "format": "json"}).json()
    assert [row["stale"] for row in rows] == ["software"], "still stale: the newest software never ran it"


def test_client_stats_without_keys_stay_valid_and_unknown_keys_are_passed_over(serve: Serve) -> None:
    client = serve()
    register(client, OLD)
    old_client = client.post("/v1/client-stats", json={"chip": CHIP["name"], "answers": {"exact": 3}})
    assert old_client.status_code == 200, old_client.text
    assert old_client.json() == {"accepted": 3, "keys": 0}
    keys = [
        {"kernel": "no_such_kernel", "shape": {"n": 4}, "dtype": "float32", "count": 2},
        {"kernel": "add", "shape": {"m": 4}, "dtype": "float32", "count": 2},
        {"kernel": "add", "shape": {"n": 4}, "dtype": "float32", "count": 2},
    ]
    mixed = client.post("/v1/client-stats", json={"chip": CHIP["name"], "answers": {}, "keys": keys})
    assert mixed.json() == {"accepted": 0, "keys": 1}
    too_many = [keys[2]] * 101
    refused = client.post("/v1/client-stats", json={"chip": CHIP["name"], "answers": {}, "keys": too_many})
    assert refused.status_code == 422
    assert refused.json()["field"] == "keys"
    assert services(client).reads.usage.flush(services(client).db) == 1
