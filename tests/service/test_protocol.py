"""Contract suite of the store, the queue and the worker protocol, through the real app.

Runs on SQLite and PostgreSQL (``database_url``). The test plays the worker:
it registers, leases, asks, "measures" with a synthetic time and tells.
Time comes from a manual clock, so lease expiry is tested without sleeping.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.bundles import resealed
from tests.credentials import ADMIN, ADMIN_SECRET
from tiletune.service.app import create_app
from tiletune.service.migrate import upgrade
from tiletune.service.settings import Settings

from .conftest import ManualClock, postgres_database

CHIP = {"name": "cpu/Test Chip (AVX2)/2c", "kind": "cpu", "local_memory_bytes": 1 << 20}
LEASE_S = 60.0


@pytest.fixture
def client(database_url: str, clock: ManualClock) -> Iterator[TestClient]:
    upgrade(database_url)
    settings = Settings(
        db_url=database_url, lease_s=LEASE_S, heartbeat_s=5, max_lease_failures=3, admin_token=ADMIN_SECRET
    )
    with TestClient(create_app(settings, clock=clock, reaper=False), headers=ADMIN) as test_client:
        yield test_client


def register(client: TestClient, name: str = "w", chip: dict[str, Any] | None = None) -> int:
    response = client.post(
        "/v1/workers",
        json={"name": name, "chip": chip or CHIP, "backends": ["torch"], "software": {"torch": "2.13.0"}},
    )
    assert response.status_code == 201, response.text
    worker_id: int = response.json()["id"]
    return worker_id


def submit(client: TestClient, **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"kernel": "add", "shapes": [{"n": 65536}], "dtypes": ["float32"], "trials": 6}
    body.update(overrides)
    response = client.post("/v1/sweeps", json=body)
    assert response.status_code == 201, response.text
    sweep: dict[str, Any] = response.json()
    return sweep


def lease(client: TestClient, worker_id: int) -> dict[str, Any] | None:
    response = client.post("/v1/leases", json={"worker_id": worker_id})
    if response.status_code == 204:
        return None
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def held(token: str) -> dict[str, str]:
    """The header that names the lease a call is about."""
    return {"X-Lease-Token": token}


#: torch's op's synthetic time: slower than the tiles near the optimum, faster than the default.
VENDOR_MS = 3.0


def synthetic_ms(config: dict[str, int]) -> float:
    """A deterministic time: best at tile 4096, buffers 2, depth 2; torch's op (the vendor config)
    at :data:`VENDOR_MS`."""
    if config == {"vendor": 1}:
        return VENDOR_MS
    tile = config["tile_size"]
    return (
        1.0
        + abs(math.log2(tile) - 12)
        + 0.3 * abs(config["buffer_num"] - 2)
        + 0.2 * abs(config["pipeline_depth"] - 2)
    )


def measurement(ms: float) -> dict[str, Any]:
    return {"median_ms": ms, "p10_ms": ms * 0.95, "p90_ms": ms * 1.05, "min_ms": ms * 0.9, "samples": 10}


def ask(client: TestClient, token: str, n: int = 1) -> dict[str, Any]:
    response = client.post("/v1/lease/ask", headers=held(token), params={"n": n})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def tell(client: TestClient, token: str, tasks: list[dict[str, Any]]) -> dict[str, Any]:
    outcomes = [
        {"trial_id": task["trial_id"], "measurement": measurement(synthetic_ms(task["config"]))}
        for task in tasks
    ]
    response = client.post("/v1/lease/tell", headers=held(token), json={"outcomes": outcomes})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def work_job(client: TestClient, token: str, batch: int = 2) -> dict[str, Any]:
    """Ask and tell until validation, then complete; the finished job."""
    while True:
        answer = ask(client, token, batch)
        if answer["phase"] == "search":
            tell(client, token, answer["tasks"])
            continue
        assert answer["phase"] == "validate", answer
        configs = answer["validate_configs"]
        results = [{"config": c, "measurement": measurement(synthetic_ms(c))} for c in configs]
        response = client.post("/v1/lease/complete", headers=held(token), json={"results": results})
        assert response.status_code == 200, response.text
        job: dict[str, Any] = response.json()
        return job


def test_a_sweep_is_tuned_promoted_and_looked_up(client: TestClient) -> None:
    worker = register(client)
    sweep = submit(client, shapes=[{"n": 65536}, {"n": 16384}])
    assert [job["state"] for job in sweep["jobs"]] == ["queued", "queued"]
    for _ in sweep["jobs"]:
        leased = lease(client, worker)
        assert leased is not None
        assert leased["job"]["default_config"]["tile_size"] == 256  # the hand-written rule
        job = work_job(client, leased["token"])
        assert job["state"] == "done"
        assert job["progress"]["completed"] == 6
        assert job["progress"]["speedup_vs_default"] > 1
    assert lease(client, worker) is None
    found = client.get("/v1/configs/add", params={"shape": "n=65536", "chip": CHIP["name"], "match": "exact"})
    assert found.status_code == 200, found.text
    answer = found.json()
    assert answer["match"] == "exact"
    assert answer["best"]["job_id"] == sweep["jobs"][0]["id"]
    assert answer["best"]["software"] == {"torch": "2.13.0"}
    assert answer["config"]["tile_size"] >= 1024  # moved toward the synthetic optimum
    shown = client.get(f"/v1/sweeps/{sweep['id']}").json()
    assert shown["state"] == "finished"
    assert shown["counts"] == {"done": 2}
    history = client.get("/v1/history/add", params={"shape": "n=65536"}).json()
    assert len(history) == 1
    assert history[0]["config"] == answer["config"]


def search_one_job(client: TestClient) -> tuple[str, list[dict[str, int]]]:
    """Lease a 4-trial job of ``add`` and search it (synthetic times): its lease and finalists."""
    worker = register(client)
    submit(client, shapes=[{"n": 65536}], trials=4)
    leased = lease(client, worker)
    assert leased is not None
    token = leased["token"]
    while (answer := ask(client, token, 2))["phase"] == "search":
        assert {"vendor": 1} not in [task["config"] for task in answer["tasks"]]  # the search explores tiles
        tell(client, token, answer["tasks"])
    return token, answer["validate_configs"]


def test_torch_op_is_validated_beside_the_tiles_and_answers_where_none_beats_it(client: TestClient) -> None:
    token, finalists = search_one_job(client)
    assert finalists[-1] == {"vendor": 1}
    # torch's op 2 % faster than the best tile: not clearly beaten, it is the answer
    results = [
        {"config": c, "measurement": measurement(1.0 if c == {"vendor": 1} else max(1.02, synthetic_ms(c)))}
        for c in finalists
    ]
    done = client.post("/v1/lease/complete", headers=held(token), json={"results": results})
    assert done.status_code == 200, done.text
    assert done.json()["progress"]["best_config"] == {"vendor": 1}
    found = client.get("/v1/configs/add", params={"shape": "n=65536", "chip": CHIP["name"], "match": "exact"})
    assert found.status_code == 200, found.text
    assert found.json()["config"] == {"vendor": 1}
    page = client.get(f"/jobs/{done.json()['id']}")
    assert "torch&#39;s op" in page.text or "torch's op" in page.text
    overview = client.get("/")
    assert overview.status_code == 200, overview.text
    assert "1/1 · " in overview.text  # the coverage cell: one key tuned of one requested,
    assert " · 1 torch</a>" in overview.text  # and it is answered by torch's op


def test_a_worker_that_cannot_run_torch_op_leaves_the_default_the_baseline(client: TestClient) -> None:
    """An older worker refuses the vendor config as outside the space: it reports it failed."""
    token, finalists = search_one_job(client)
    results = [
        {"config": c, "error": "ConfigError: add knobs are [...]: unknown ['vendor']"}
        if c == {"vendor": 1}
        else {"config": c, "measurement": measurement(synthetic_ms(c))}
        for c in finalists
    ]
    done = client.post("/v1/lease/complete", headers=held(token), json={"results": results})
    assert done.status_code == 200, done.text
    assert done.json()["progress"]["best_config"]["tile_size"] >= 1024


def test_every_trial_is_kept_with_its_outcome(client: TestClient) -> None:
    worker = register(client)
    submit(client)
    leased = lease(client, worker)
    assert leased is not None
    job = work_job(client, leased["token"])
    trials = client.get(f"/v1/jobs/{job['id']}/trials").json()
    searched = [t for t in trials if t["phase"] == "search"]
    assert len(searched) == 6
    assert all(t["state"] == "measured" and t["median_ms"] > 0 for t in searched)
    assert any(t["phase"] == "validate" for t in trials)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"kernel": "nope", "shapes": [{"n": 1}]}, "kernel"),
        ({"kernel": "add", "shapes": [{"m": 1}]}, "shapes[0]"),
        ({"kernel": "add", "shapes": [{"n": 0}]}, "shapes[0].n"),
        ({"kernel": "add", "shapes": [{"n": "many"}]}, "shapes[0].n"),
        ({"kernel": "add", "shapes": [{"n": 8}], "dtypes": ["int3"]}, "dtypes[0]"),
        ({"kernel": "add", "shapes": [{"n": 8}], "trials": 0}, "trials"),
        ({"kernel": "add", "shapes": [{"n": 8}], "strategy": "magic"}, "strategy"),
        ({"kernel": "add", "shapes": []}, "shapes"),
        ({"shapes": [{"n": 8}]}, "shapes"),
        ({"dtypes": ["float32"]}, "kernels"),
        (
            {
                "kernels": [
                    {"kernel": "add", "shapes": [{"n": 8}]},
                    {"kernel": "softmax", "shapes": [{"rows": 2}]},
                ]
            },
            "kernels[1].shapes[0]",
        ),
        (
            {"kernel": "add", "shapes": [{"n": 8}], "kernels": [{"kernel": "nope", "shapes": [{"n": 8}]}]},
            "kernels[0].kernel",
        ),
    ],
)
def test_a_bad_sweep_names_the_field_and_changes_nothing(
    client: TestClient, body: dict[str, Any], field: str
) -> None:
    response = client.post("/v1/sweeps", json=body)
    assert response.status_code == 422, response.text
    error = response.json()
    assert error["code"] == "invalid"
    assert error["field"] == field, error
    assert client.get("/v1/sweeps").json() == []
    assert client.get("/v1/jobs").json() == []


def test_tell_is_idempotent_per_trial(client: TestClient) -> None:
    worker = register(client)
    submit(client)
    leased = lease(client, worker)
    assert leased is not None
    tasks = ask(client, leased["token"], 2)["tasks"]
    assert tell(client, leased["token"], tasks) == {"accepted": 2, "repeated": 0}
    assert tell(client, leased["token"], tasks) == {"accepted": 0, "repeated": 2}
    job = client.get(f"/v1/jobs/{leased['job']['id']}").json()
    assert job["progress"]["completed"] == 2


def test_an_expired_lease_is_fenced_and_its_trials_are_asked_again(
    client: TestClient, clock: ManualClock
) -> None:
    first, second = register(client, "first"), register(client, "second")
    submit(client)
    leased = lease(client, first)
    assert leased is not None
    token = leased["token"]
    tasks = ask(client, token, 2)["tasks"]
    tell(client, token, tasks[:1])
    clock.advance(LEASE_S + 1)
    late = client.post(
        "/v1/lease/tell", headers=held(token), json={"outcomes": [{"trial_id": 0, "error": "x"}]}
    )
    assert late.status_code == 409
    assert late.json()["code"] == "lease_lost"
    taken_over = lease(client, second)  # leasing reaps the expired lease first
    assert taken_over is not None
    assert taken_over["job"]["id"] == leased["job"]["id"]
    again = ask(client, taken_over["token"], 1)["tasks"]
    assert again[0]["config"] == tasks[1]["config"]
    job = client.get(f"/v1/jobs/{leased['job']['id']}").json()
    assert job["lease_failures"] == 1
    assert job["progress"]["completed"] == 1
    states = [t["state"] for t in client.get(f"/v1/jobs/{job['id']}/trials").json()]
    assert states.count("abandoned") == 1


def test_a_heartbeat_keeps_a_lease_alive(client: TestClient, clock: ManualClock) -> None:
    worker = register(client)
    submit(client)
    leased = lease(client, worker)
    assert leased is not None
    for _ in range(3):
        clock.advance(LEASE_S * 0.8)
        response = client.post("/v1/lease/heartbeat", headers=held(leased["token"]))
        assert response.status_code == 200, response.text
    assert ask(client, leased["token"])["phase"] == "search"


def test_a_job_whose_leases_keep_failing_ends_failed_with_its_reasons(
    client: TestClient, clock: ManualClock
) -> None:
    worker = register(client)
    submit(client)
    for attempt in range(3):
        leased = lease(client, worker)
        assert leased is not None, f"attempt {attempt}"
        clock.advance(LEASE_S + 1)
    assert lease(client, worker) is None
    jobs = client.get("/v1/jobs").json()
    assert jobs[0]["state"] == "failed"
    assert len(jobs[0]["failure_reasons"]) == 3
    assert "expired" in jobs[0]["failure_reasons"][0]


def test_release_returns_the_job_and_failed_releases_count(client: TestClient) -> None:
    worker = register(client)
    submit(client)
    leased = lease(client, worker)
    assert leased is not None
    ask(client, leased["token"], 2)
    release = {"reason": "cannot run", "failed": True}
    response = client.post("/v1/lease/release", headers=held(leased["token"]), json=release)
    assert response.status_code == 200, response.text
    assert response.json()["state"] == "queued"
    assert response.json()["failure_reasons"] == ["cannot run"]
    after = client.post("/v1/lease/ask", headers=held(leased["token"]))
    assert after.status_code == 409
    again = lease(client, worker)
    assert again is not None
    assert len(ask(client, again["token"], 2)["tasks"]) == 2


def test_a_job_of_a_tuned_key_is_skipped_unless_forced(client: TestClient) -> None:
    worker = register(client)
    submit(client, chips=[CHIP["name"]])
    leased = lease(client, worker)
    assert leased is not None
    work_job(client, leased["token"])
    assert [j["state"] for j in submit(client, chips=[CHIP["name"]])["jobs"]] == ["skipped"]
    assert [j["state"] for j in submit(client, chips=[CHIP["name"]], force=True)["jobs"]] == ["queued"]
    submit(client)  # any chip: skipped when this chip leases it
    forced = lease(client, worker)
    assert forced is not None
    assert forced["job"]["id"] == 3
    assert client.get("/v1/jobs/4").json()["state"] == "queued"


def test_cancelled_jobs_answer_done(client: TestClient) -> None:
    worker = register(client)
    sweep = submit(client, shapes=[{"n": 4096}, {"n": 8192}])
    leased = lease(client, worker)
    assert leased is not None
    response = client.post(f"/v1/sweeps/{sweep['id']}/cancel")
    assert response.json()["counts"] == {"cancelled": 2}
    assert ask(client, leased["token"])["phase"] == "done"
    assert lease(client, worker) is None


def test_several_workers_share_a_job_without_repeating_configs(client: TestClient) -> None:
    workers = [register(client, f"w{i}") for i in range(2)]
    submit(client, workers_per_job=2, trials=8)
    leases = [lease(client, w) for w in workers]
    assert all(leased is not None for leased in leases)
    tokens = [leased["token"] for leased in leases if leased is not None]
    assert leases[0] is not None
    assert leases[1] is not None
    assert leases[0]["job"]["id"] == leases[1]["job"]["id"]
    asked = [ask(client, token, 3)["tasks"] for token in tokens]
    configs = [tuple(sorted(t["config"].items())) for tasks in asked for t in tasks]
    assert len(configs) == len(set(configs)) == 6


def test_jobs_for_another_chip_are_not_leased(client: TestClient) -> None:
    worker = register(client)
    submit(client, chips=["npu/Ascend910B2"])
    assert lease(client, worker) is None


def test_concurrent_claims_never_lease_a_job_twice(client: TestClient) -> None:
    workers = [register(client, f"w{i}") for i in range(6)]
    submit(client, shapes=[{"n": 1024 * (i + 1)} for i in range(4)])
    claimed: list[int] = []
    barrier = threading.Barrier(len(workers))

    def claim(worker: int) -> None:
        barrier.wait()
        leased = lease(client, worker)
        if leased is not None:
            claimed.append(leased["job"]["id"])

    threads = [threading.Thread(target=claim, args=(w,)) for w in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(claimed) == sorted(set(claimed))
    assert len(claimed) == 4


def test_lookup_falls_back_to_nearest_then_default(client: TestClient) -> None:
    worker = register(client)
    submit(client, shapes=[{"n": 65536}])
    leased = lease(client, worker)
    assert leased is not None
    work_job(client, leased["token"])
    params = {"chip": CHIP["name"], "dtype": "float32"}
    nearest = client.get("/v1/configs/add", params={**params, "shape": "n=131072"}).json()
    assert nearest["match"] == "nearest"
    assert nearest["best"]["shape"] == {"n": 65536}
    default = client.get("/v1/configs/add", params={**params, "shape": "n=131072", "match": "default"}).json()
    assert default["match"] == "nearest"
    missing = client.get("/v1/configs/add", params={**params, "shape": "n=131072", "match": "exact"})
    assert missing.status_code == 404
    fp16 = {**params, "shape": "n=65536", "dtype": "float16"}
    other_dtype = client.get("/v1/configs/add", params=fp16).json()
    assert other_dtype["match"] == "default"
    bad = client.get("/v1/configs/add", params={**params, "shape": "n=abc"})
    assert bad.status_code == 422
    assert bad.json()["field"] == "shape.n"


def test_configs_export_and_import_round_trip(client: TestClient) -> None:
    worker = register(client)
    submit(client)
    leased = lease(client, worker)
    assert leased is not None
    work_job(client, leased["token"])
    bundle = client.get("/v1/configs", params={"chip": CHIP["name"]}).json()
    assert len(bundle["configs"]) == 1
    assert client.post("/v1/configs/import", json=bundle).json() == {"changed": 0}
    bundle["configs"][0]["median_ms"] /= 2
    tampered = client.post("/v1/configs/import", json=bundle)
    assert (tampered.status_code, tampered.json()["field"]) == (422, "checksum")
    foreign = client.post("/v1/configs/import", json={**bundle, "checksum": "\u00d6\u0018"})  # not ASCII
    assert (foreign.status_code, foreign.json()["field"]) == (422, "checksum")
    bundle = resealed(bundle)
    # A best measured here is replaced by an import only when the admin asks for it.
    assert client.post("/v1/configs/import", json=bundle).json() == {"changed": 0}
    assert client.post("/v1/configs/import", json=bundle, params={"force": True}).json() == {"changed": 1}


def test_health_metrics_and_openapi(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    submit(client)
    assert 'tiletune_jobs{state="queued"} 1.0' in client.get("/metrics").text
    paths = client.get("/openapi.json").json()["paths"]
    assert "/v1/lease/ask" in paths


def test_two_replicas_over_postgres_serve_one_job_without_repeating_a_config(clock: ManualClock) -> None:
    with postgres_database() as url:
        upgrade(url)
        settings = Settings(db_url=url, lease_s=LEASE_S, admin_token=ADMIN_SECRET)
        with (
            TestClient(create_app(settings, clock=clock, reaper=False), headers=ADMIN) as first,
            TestClient(create_app(settings, clock=clock, reaper=False), headers=ADMIN) as second,
        ):
            worker = register(first)
            submit(second, trials=8)
            leased = lease(first, worker)
            assert leased is not None
            asked: list[tuple[tuple[str, int], ...]] = []
            for turn in range(8):
                replica = (first, second)[turn % 2]
                tasks = ask(replica, leased["token"])["tasks"]
                asked += [tuple(sorted(task["config"].items())) for task in tasks]
                tell(replica, leased["token"], tasks)
            assert len(asked) == len(set(asked)) == 8
            assert ask(first, leased["token"])["phase"] == "validate"
            assert first.get(f"/v1/jobs/{leased['job']['id']}").json()["progress"]["completed"] == 8


def test_a_new_shape_starts_from_the_default_and_the_nearest_tuned_best(client: TestClient) -> None:
    worker = register(client)
    submit(client, shapes=[{"n": 65536}])
    leased = lease(client, worker)
    assert leased is not None
    tuned = work_job(client, leased["token"])["progress"]["best_config"]
    submit(client, shapes=[{"n": 131072}])
    leased = lease(client, worker)
    assert leased is not None
    first_two = [task["config"] for task in ask(client, leased["token"], 2)["tasks"]]
    assert first_two == [leased["job"]["default_config"], tuned]


def test_a_new_chip_starts_from_the_default_and_the_best_of_the_same_key_on_other_chips(
    client: TestClient,
) -> None:
    first = register(client, "first")
    submit(client, shapes=[{"n": 65536}])
    leased = lease(client, first)
    assert leased is not None
    tuned_job = work_job(client, leased["token"])
    tuned = tuned_job["progress"]["best_config"]
    trials = client.get(f"/v1/jobs/{tuned_job['id']}/trials").json()
    measured = [t for t in trials if t["phase"] == "search" and t["state"] == "measured"]
    fastest = [t["config"] for t in sorted(measured, key=lambda t: t["median_ms"])]
    other_chip = {**CHIP, "name": "cpu/Other Chip (AVX2)/2c"}
    second = register(client, "second", chip=other_chip)
    submit(client, shapes=[{"n": 65536}], chips=[other_chip["name"]])
    leased = lease(client, second)
    assert leased is not None
    default = leased["job"]["default_config"]
    seeds = [task["config"] for task in ask(client, leased["token"], 4)["tasks"]]
    assert seeds[:2] == [default, tuned]
    assert seeds[2:] == [config for config in fastest if config not in (default, tuned)][:2]


def test_one_sweep_may_tune_several_kernels(client: TestClient) -> None:
    sweep = submit(
        client,
        kernel=None,
        shapes=[],
        kernels=[
            {"kernel": "add", "shapes": [{"n": 4096}, {"n": 8192}]},
            {"kernel": "softmax", "shapes": [{"rows": 8, "cols": 64}]},
        ],
        dtypes=["float32", "float16"],
    )
    assert sweep["kernels"] == ["add", "softmax"]
    assert [(job["kernel"], job["shape_key"], job["dtype"]) for job in sweep["jobs"]] == [
        ("add", "n=4096", "float32"),
        ("add", "n=4096", "float16"),
        ("add", "n=8192", "float32"),
        ("add", "n=8192", "float16"),
        ("softmax", "rows=8,cols=64", "float32"),
        ("softmax", "rows=8,cols=64", "float16"),
    ]


def test_a_body_over_the_limit_is_refused_and_changes_nothing(database_url: str) -> None:
    upgrade(database_url)
    settings = Settings(db_url=database_url, max_body_bytes=2000, admin_token=ADMIN_SECRET)
    with TestClient(create_app(settings, reaper=False), headers=ADMIN) as client:
        shapes = [{"n": 1024 + i} for i in range(200)]
        response = client.post("/v1/sweeps", json={"kernel": "add", "shapes": shapes})
        assert response.status_code == 413
        assert response.json()["code"] == "too_large"
        assert client.get("/v1/jobs").json() == []


def test_a_promotion_is_seen_by_the_next_lookup_despite_the_lookup_cache(client: TestClient) -> None:
    worker = register(client)
    params = {"shape": "n=65536", "chip": CHIP["name"]}
    assert client.get("/v1/configs/add", params=params).json()["match"] == "default"
    submit(client)
    leased = lease(client, worker)
    assert leased is not None
    work_job(client, leased["token"])
    assert client.get("/v1/configs/add", params=params).json()["match"] == "exact"


def test_a_job_ends_on_convergence_when_given_patience(client: TestClient) -> None:
    worker = register(client)
    submit(client, trials=40, patience=3)
    leased = lease(client, worker)
    assert leased is not None
    token = leased["token"]
    while (answer := ask(client, token))["phase"] == "search":
        outcomes = [{"trial_id": t["trial_id"], "measurement": measurement(1.0)} for t in answer["tasks"]]
        client.post("/v1/lease/tell", headers=held(token), json={"outcomes": outcomes}).raise_for_status()
    assert answer["phase"] == "validate"
    assert client.get(f"/v1/jobs/{leased['job']['id']}").json()["progress"]["completed"] == 4


def test_a_worker_running_another_version_of_a_kernel_passes_its_jobs_by(client: TestClient) -> None:
    worker = {"name": "old", "chip": CHIP, "backends": ["torch"], "kernel_versions": {"add": 99}}
    response = client.post("/v1/workers", json=worker)
    assert response.status_code == 201, response.text
    submit(client)
    assert lease(client, response.json()["id"]) is None
    assert lease(client, register(client)) is not None
