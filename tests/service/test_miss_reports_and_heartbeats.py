"""A reader's miss reports never hold SQLite's writer from a worker: real server process, real HTTP.

Three maximal reports (10,000 keys each, the most the wire allows) arrive at once from a reader
token while a worker token registers, leases a job and heartbeats its lease: every heartbeat
answers within 1 s (the issue's bound), and every report is counted in full.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx

from tests.credentials import ADMIN

from .processes import start_server, stop

CHIP = {"name": "cpu/Heartbeat Test Chip/2c", "kind": "cpu", "local_memory_bytes": 1 << 20}
REPORTS = 3
#: The most entries a miss report may hold (``MissesCreate``).
MAX_KEYS = 10_000
HEARTBEAT_BOUND_S = 1.0
JSON = {"Content-Type": "application/json"}


def token(http: httpx.Client, role: str) -> dict[str, str]:
    """Headers of a new token of ``role``."""
    created = http.post("/v1/tokens", json={"role": role, "name": f"{role} under load"}, headers=ADMIN)
    assert created.status_code == 201, created.text
    return {"Authorization": f"Bearer {created.json()['token']}"}


def lease_a_job(http: httpx.Client, worker: dict[str, str]) -> str:
    """Register a worker with ``worker``'s token and lease the one queued job; its lease token."""
    body = {"name": "w", "chip": CHIP, "backends": ["torch"], "software": {"torch": "2.13.0"}}
    registered = http.post("/v1/workers", json=body, headers=worker)
    assert registered.status_code == 201, registered.text
    sweep = {
        "kernel": "add",
        "shapes": [{"n": 4096}],
        "chips": [CHIP["name"]],
        "trials": 4,
        "backend": "torch",
    }
    assert http.post("/v1/sweeps", json=sweep, headers=ADMIN).status_code == 201
    leased = http.post("/v1/leases", json={"worker_id": registered.json()["id"]}, headers=worker)
    assert leased.status_code == 201, leased.text
    lease_token: str = leased.json()["token"]
    return lease_token


def maximal_report(first_n: int) -> bytes:
    """A report of ``MAX_KEYS`` keys (add, n from ``first_n``) on the chip, each missed once, as sent."""
    misses = [
        {"kernel": "add", "shape": {"n": n}, "dtype": "float32", "chip": CHIP["name"], "match": "default"}
        for n in range(first_n, first_n + MAX_KEYS)
    ]
    return json.dumps({"misses": misses}).encode()


def test_heartbeats_answer_within_a_second_during_three_maximal_reports(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    try:
        with httpx.Client(base_url=server.url, timeout=120.0) as http:
            reader, worker = token(http, "reader"), token(http, "worker")
            lease = {**worker, "X-Lease-Token": lease_a_job(http, worker)}
            bodies = [maximal_report(1 + i * MAX_KEYS) for i in range(REPORTS)]
            answers: list[tuple[int, object]] = []
            barrier = threading.Barrier(REPORTS + 1)

            def send(body: bytes) -> None:
                barrier.wait()
                response = http.post("/v1/misses", content=body, headers={**reader, **JSON})
                answers.append((response.status_code, response.json().get("accepted")))

            senders = [threading.Thread(target=send, args=(body,), daemon=True) for body in bodies]
            for sender in senders:
                sender.start()
            barrier.wait()
            heartbeats: list[tuple[int, float]] = []
            while any(sender.is_alive() for sender in senders):
                start = time.monotonic()
                try:
                    status = http.post("/v1/lease/heartbeat", headers=lease, timeout=10.0).status_code
                except httpx.TimeoutException:
                    status = 0  # no answer within 10 s
                heartbeats.append((status, time.monotonic() - start))
                if status != 200 or heartbeats[-1][1] >= HEARTBEAT_BOUND_S:
                    break
                time.sleep(0.05)
            slowest_s = max(waited for _, waited in heartbeats)
            assert slowest_s < HEARTBEAT_BOUND_S, f"a heartbeat waited {slowest_s:.2f} s: {heartbeats}"
            assert {status for status, _ in heartbeats} == {200}
            assert len(heartbeats) >= 3, "the reports were over before the heartbeats could wait on them"
            for sender in senders:
                sender.join(timeout=60)
            assert answers == [(200, MAX_KEYS)] * REPORTS
            listed = http.get("/v1/misses", params={"limit": 1000}, headers=reader).json()
            assert len(listed) == 1000
            assert {row["count"] for row in listed} == {1}
    finally:
        stop(server.process)
    assert "database is locked" not in server.log(400)
