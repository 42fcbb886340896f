"""Single-key config lookups over HTTP: requests/s and latency at 1, 16 and 64 concurrent clients.

A real ``tiletune server`` process (uvicorn, one worker process) on a fresh
SQLite file (or ``--db``) holding 10,000 best configs (imported as a bundle
for one chip); each client sends ``GET /v1/configs/add?shape=n=...`` for
random tuned shapes over one keep-alive connection, back to back, for
``--seconds`` per level (the clients built before the clock starts). Prints one JSON document: per
level, the milliseconds its clients took to build, requests/s,
p50 / p99 latency in ms and the error count.

Run: ``.venv/bin/python benchmarks/http_lookup.py [--configs 10000] [--seconds 5]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from tiletune.client.wire import BestConfigPublic, ConfigBundle

CHIP_NAME = "cpu/Benchmark Chip/2c"
CHIP = {"name": CHIP_NAME, "kind": "cpu", "local_memory_bytes": 1 << 20}
LEVELS = (1, 16, 64)


#: The admin token of the benchmark's server (a fresh one per run) and its request headers.
BENCH_TOKEN = "tt_" + secrets.token_urlsafe(32)
AUTH = {"Authorization": f"Bearer {BENCH_TOKEN}"}
JSON = {"Content-Type": "application/json"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def start_server(db_url: str, port: int, log: Path | None = None) -> subprocess.Popen[bytes]:
    """``tiletune server`` as a child process (admin token :data:`BENCH_TOKEN`), once its /healthz
    answers; its log lines go to ``log`` (by default a new file in the temporary folder: a pipe
    nobody reads fills up, and the server blocks on its next access line)."""
    if log is None:
        log = Path(tempfile.mkstemp(prefix="tiletune-server-", suffix=".log")[1])
    command = [sys.executable, "-m", "tiletune.service.cli", "server", "--db", db_url, "--port", str(port)]
    env = {**os.environ, "TILETUNE_ADMIN_TOKEN": BENCH_TOKEN}
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log.open("ab"), env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return server
        except httpx.TransportError:
            time.sleep(0.2)
    server.kill()
    raise RuntimeError(f"server did not start: {log.read_text()[-2000:]}")


def fill(base: str, count: int) -> list[int]:
    """Register the chip and import ``count`` best configs of ``add``; the tuned sizes."""
    worker = {"name": "bench", "chip": CHIP, "backends": ["torch"], "software": {"torch": "bench"}}
    httpx.post(f"{base}/v1/workers", json=worker, headers=AUTH, timeout=30).raise_for_status()
    sizes = [1024 + 16 * i for i in range(count)]
    now = datetime.now(UTC).isoformat()
    configs = [
        {
            "kernel": "add",
            "kernel_version": 1,
            "shape": {"n": n},
            "shape_key": f"n={n}",
            "dtype": "float32",
            "chip": CHIP["name"],
            "config": {"tile_size": 256, "buffer_num": 2, "pipeline_depth": 2},
            "median_ms": 1.0,
            "promoted_at": now,
            "software": {"torch": "bench"},
        }
        for n in sizes
    ]
    bundle = ConfigBundle(configs=[BestConfigPublic.model_validate(c) for c in configs]).sealed()
    response = httpx.post(
        f"{base}/v1/configs/import", content=bundle.model_dump_json(), headers={**AUTH, **JSON}, timeout=300
    )
    response.raise_for_status()
    return sizes


async def client_loop(
    client: httpx.AsyncClient, sizes: list[int], stop_at: float, seed: int
) -> tuple[list[float], int]:
    rng = random.Random(seed)
    latencies: list[float] = []
    errors = 0
    async with client:
        while time.perf_counter() < stop_at:
            n = rng.choice(sizes)
            started = time.perf_counter()
            response = await client.get(
                "/v1/configs/add", params={"shape": f"n={n}", "chip": CHIP_NAME, "match": "exact"}
            )
            latencies.append((time.perf_counter() - started) * 1e3)
            errors += response.status_code != 200
    return latencies, errors


async def level(base: str, sizes: list[int], clients: int, seconds: float) -> dict[str, Any]:
    """One level of ``clients``, each built before the clock starts: an ``httpx.AsyncClient`` takes
    about 30 ms of CPU to build (its TLS context), and 64 built inside the measured window held up
    every first request by about 64 of those (the p99 of 1.5 s an earlier version reported)."""
    building = time.perf_counter()
    built = [httpx.AsyncClient(base_url=base, timeout=30) for _ in range(clients)]
    built_ms = (time.perf_counter() - building) * 1e3
    stop_at = time.perf_counter() + seconds
    started = time.perf_counter()
    results = await asyncio.gather(*(client_loop(c, sizes, stop_at, i) for i, c in enumerate(built)))
    wall = time.perf_counter() - started
    latencies = sorted(ms for lat, _ in results for ms in lat)
    return {
        "clients": clients,
        "clients_built_ms": round(built_ms, 1),
        "requests": len(latencies),
        "errors": sum(err for _, err in results),
        "requests_per_s": len(latencies) / wall,
        "p50_ms": statistics.median(latencies),
        "p99_ms": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--configs", type=int, default=10_000, help="best configs stored (default 10000)")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per level (default 5)")
    parser.add_argument("--db", default=None, help="database URL (default: a fresh SQLite file)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        db_url = args.db or f"sqlite:///{Path(folder) / 'lookup.db'}"
        port = free_port()
        server = start_server(db_url, port, Path(folder) / "server.log")
        try:
            base = f"http://127.0.0.1:{port}"
            sizes = fill(base, args.configs)
            asyncio.run(level(base, sizes, 1, 1.0))  # warm-up
            levels = [asyncio.run(level(base, sizes, n, args.seconds)) for n in LEVELS]
        finally:
            server.terminate()
            server.wait(timeout=30)
    report = {
        "benchmark": "http_lookup",
        "configs": args.configs,
        "database": "postgresql" if args.db and args.db.startswith("postgres") else "sqlite",
        "cpu_count": os.cpu_count(),
        "levels": levels,
    }
    json.dump(report, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
