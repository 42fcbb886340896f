"""A worker that lies about its times cannot promote its pick: real server, real honest worker.

The liar registers this machine's CPU chip (as the honest ``tiletune worker`` does), leases an
``add`` job first and answers over HTTP: one time no chip could reach (refused: the trial is
``failed`` with the server's reason) and a plausible lie for its pick. Since another worker of the
chip is online, the liar is answered ``done`` instead of the validation run; the honest worker
leases the job, validates it, and the job names who measured and who confirmed. Whatever is
promoted carries the honest worker's time, never the liar's.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx

from tests.credentials import ADMIN
from tests.service.processes import start_server, start_worker, stop
from tiletune.kernels.native.spec import all_cores
from tiletune.service.scheduling.plausibility import REFUSED
from tiletune.tuner.measure.worker import Worker

N = 2**20
IMPOSSIBLE_MS = 1e-6
#: The liar's pick: plausible on a CPU (about 1 TB/s for 12.6 MB), ~100x faster than the truth.
LIE_MS = 0.012
OTHERS_MS = 5.0
DONE_WITHIN_S = 240.0


def _token(http: httpx.Client, name: str) -> str:
    made = http.post("/v1/tokens", json={"role": "worker", "name": name}, headers=ADMIN)
    assert made.status_code == 201, made.text
    token: str = made.json()["token"]
    return token


def _measured(ms: float) -> dict[str, Any]:
    return {"median_ms": ms, "p10_ms": ms, "p90_ms": ms, "min_ms": ms, "samples": 10}


def _lie_through_the_search(http: httpx.Client, lease: dict[str, str]) -> str:
    """Answer every task: the first impossibly fast, the second the pick, the rest slow; the
    phase the server ends the search with."""
    told = 0
    while True:
        assert http.post("/v1/lease/heartbeat", headers=lease).status_code == 200
        answer = http.post("/v1/lease/ask", params={"n": 4}, headers=lease)
        assert answer.status_code == 200, answer.text
        phase: str = answer.json()["phase"]
        if phase == "wait":
            time.sleep(0.2)
            continue
        if phase != "search":
            return phase
        outcomes = []
        for task in answer.json()["tasks"]:
            ms = IMPOSSIBLE_MS if told == 0 else LIE_MS if told == 1 else OTHERS_MS
            outcomes.append({"trial_id": task["trial_id"], "measurement": _measured(ms)})
            told += 1
        assert http.post("/v1/lease/tell", json={"outcomes": outcomes}, headers=lease).status_code == 200


def _job_when_done(http: httpx.Client, job_id: int) -> dict[str, Any]:
    deadline = time.monotonic() + DONE_WITHIN_S
    while time.monotonic() < deadline:
        job: dict[str, Any] = http.get(f"/v1/jobs/{job_id}").json()
        if job["state"] in ("done", "failed", "cancelled"):
            return job
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} did not end within {DONE_WITHIN_S:g} s: {job}")


def test_a_liars_pick_is_refused_or_confirmed_by_another_worker_before_it_is_promoted(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    honest = None
    try:
        with httpx.Client(base_url=server.url, timeout=30, headers=ADMIN) as admin:
            liar_token, honest_token = _token(admin, "liar"), _token(admin, "honest")
            with httpx.Client(base_url=server.url, timeout=30) as liar_http:
                liar_http.headers["Authorization"] = f"Bearer {liar_token}"
                liar = Worker(liar_http, backend="cpu", name="liar")
                liar_id = liar.register()
                chip = liar.registration().chip.name
                sweep = {"kernel": "add", "shapes": [{"n": N}], "chips": [chip], "trials": 6}
                made = admin.post("/v1/sweeps", json=sweep)
                assert made.status_code == 201, made.text
                job_id = made.json()["jobs"][0]["id"]
                leased = liar_http.post("/v1/leases", json={"worker_id": liar_id})
                assert leased.status_code == 201, leased.text
                lease = {"X-Lease-Token": leased.json()["token"]}

                # The liar registered the chip from this process: the same cores (torch's threads).
                threads = str(all_cores())
                env = {"TILETUNE_TOKEN": honest_token, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
                honest = start_worker(server.url, tmp_path / "honest.log", args=["--name", "honest"], env=env)
                _wait_until_online(admin, "honest")
                assert _lie_through_the_search(liar_http, lease) == "done"  # not the validation run
                released = liar_http.post("/v1/lease/release", json={"reason": "job done"}, headers=lease)
                assert released.status_code == 200, released.text

            job = _job_when_done(admin, job_id)
            trials = admin.get(f"/v1/jobs/{job_id}/trials").json()
            page = admin.get(f"/jobs/{job_id}").text
            best = admin.get(
                "/v1/configs/add",
                params={"shape": f"n={N}", "dtype": "float32", "chip": chip, "match": "exact"},
            )
    finally:
        if honest is not None:
            stop(honest)
        stop(server.process)

    assert job["state"] == "done", job
    refused = [trial for trial in trials if (trial.get("reason") or "").startswith(REFUSED)]
    assert len(refused) == 1, trials
    assert refused[0]["state"] == "failed"
    confirmation = job["confirmation"]
    assert confirmation["confirmed_by"] == "honest", confirmation
    assert "confirmed by <b>honest</b>" in page
    assert "liar" in confirmation["measured_by"] or confirmation["search_ms"] is None, confirmation
    validated = [trial for trial in trials if trial["phase"] == "validate"]
    assert validated
    assert {trial["worker"] for trial in validated} == {"honest"}
    _assert_promoted_honestly(best, confirmation)


def _assert_promoted_honestly(best: httpx.Response, confirmation: dict[str, Any]) -> None:
    """Nothing promoted where the workers disagree; else the winner, with the honest worker's time."""
    exact = best.status_code == 200 and best.json().get("match") == "exact"
    if confirmation["agree"] is False:  # the liar's pick won the honest run: the workers disagree
        assert not exact, best.text
        return
    assert exact, best.text  # a fresh key: the run's winner is promoted
    promoted = best.json()["best"]["median_ms"]
    assert promoted == confirmation["validation_ms"]
    assert promoted not in (LIE_MS, IMPOSSIBLE_MS)


def _wait_until_online(admin: httpx.Client, name: str) -> None:
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        if any(worker["name"] == name for worker in admin.get("/v1/workers").json()):
            return
        time.sleep(0.2)
    raise AssertionError(f"worker {name} did not register within 60 s")
