"""The client on the launch path: hit latency, prefetch time, launch overhead, a down server.

Prints one JSON document:

- ``hit``: ``ConfigClient.get`` of a known key, the shape dict built by the
  caller in the call (``{"n": n}``), against a bare dict lookup with a tuple
  key built inline, in the same run: batches of 1,000 calls alternated
  between the two, per-call ns, median and p99 over batches, and their ratio.
  Goals: p50 <= 1 µs, <= 5x the bare lookup.
- ``prefetch``: wall time of ``prefetch()`` of 10,000 configs from a real
  ``tiletune server`` (SQLite), disk cache write included; median of 3.
- ``launches``: 100,000 launches of a trivial kernel (``torch.add`` of 16
  floats into a preallocated output), with the config from the client and
  with a constant config, alternated in blocks; the difference per launch.
- ``down_server``: a client whose server does not answer; the first call
  pays one timeout; then 10,000 launches (the same key) against a prefetched
  healthy client's, alternated; the total added ms. Goal: <= 1 ms.

Run from the repository root: ``.venv/bin/python -m benchmarks.lookup_latency``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.http_lookup import CHIP_NAME, fill, free_port, start_server
from tiletune.client import ClientSettings, ConfigClient

BATCH = 1_000


def per_call_ns(call: Callable[[int], object], n: int) -> float:
    """ns per call of ``call(n)`` over one batch."""
    started = time.perf_counter_ns()
    for _ in range(BATCH):
        call(n)
    return (time.perf_counter_ns() - started) / BATCH


def quantiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"p50_ns": statistics.median(ordered), "p99_ns": ordered[int(0.99 * (len(ordered) - 1))]}


def measure_hits(client: ConfigClient, n: int, batches: int) -> dict[str, Any]:
    table = {("add", n, "float32"): client.get("add", {"n": n}, "float32")}

    def with_client(size: int) -> object:
        return client.get("add", {"n": size}, "float32")

    def bare(size: int) -> object:
        return table[("add", size, "float32")]

    ours: list[float] = []
    theirs: list[float] = []
    for _ in range(batches):
        ours.append(per_call_ns(with_client, n))
        theirs.append(per_call_ns(bare, n))
    client_q, bare_q = quantiles(ours), quantiles(theirs)
    return {
        "client": client_q,
        "bare_dict": bare_q,
        "ratio_p50": client_q["p50_ns"] / bare_q["p50_ns"],
        "goals": {
            "p50_le_1us": client_q["p50_ns"] <= 1000,
            "le_5x_bare": client_q["p50_ns"] <= 5 * bare_q["p50_ns"],
        },
    }


def measure_launches(client: ConfigClient, launches: int, blocks: int = 10) -> dict[str, Any]:
    a, b, out = torch.ones(16), torch.ones(16), torch.empty(16)
    fixed = client.get("add", {"n": 16}, "float32")

    def launch(config: object) -> None:
        torch.add(a, b, out=out)

    def timed(use_client: bool) -> float:
        started = time.perf_counter_ns()
        for _ in range(launches // blocks):
            launch(client.get("add", {"n": a.numel()}, "float32") if use_client else fixed)
        return (time.perf_counter_ns() - started) / (launches // blocks)

    with_client: list[float] = []
    without: list[float] = []
    for _ in range(blocks):
        with_client.append(timed(True))
        without.append(timed(False))
    return {
        "launches": launches,
        "with_client_ns_per_launch": statistics.median(with_client),
        "without_ns_per_launch": statistics.median(without),
        "overhead_ns_per_launch": statistics.median(with_client) - statistics.median(without),
    }


def measure_down(healthy: ConfigClient, folder: Path, launches: int = 10_000) -> dict[str, Any]:
    settings = ClientSettings(cache_dir=folder / "down-cache", backoff_s=60.0, timeout_s=0.25)
    down = ConfigClient(f"http://127.0.0.1:{free_port()}", CHIP_NAME, settings=settings)
    started = time.perf_counter()
    down.get("add", {"n": 2048}, "float32")
    first_s = time.perf_counter() - started
    healthy.get("add", {"n": 2048}, "float32")
    totals: dict[str, list[float]] = {"down": [], "healthy": []}
    for _ in range(5):
        for name, client in (("down", down), ("healthy", healthy)):
            started = time.perf_counter()
            for _ in range(launches):
                client.get("add", {"n": 2048}, "float32")
            totals[name].append((time.perf_counter() - started) * 1e3)
    down.close()
    added = statistics.median(totals["down"]) - statistics.median(totals["healthy"])
    return {
        "first_call_s": first_s,
        "launches": launches,
        "down_total_ms": statistics.median(totals["down"]),
        "healthy_total_ms": statistics.median(totals["healthy"]),
        "added_ms": added,
        "goal_added_le_1ms": added <= 1.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--configs", type=int, default=10_000, help="configs to prefetch (default 10000)")
    parser.add_argument("--batches", type=int, default=200, help="hit batches of 1,000 calls (default 200)")
    parser.add_argument("--launches", type=int, default=100_000, help="trivial launches (default 100000)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        port = free_port()
        server = start_server(f"sqlite:///{folder / 'latency.db'}", port)
        try:
            base = f"http://127.0.0.1:{port}"
            fill(base, args.configs)
            prefetch_s = []
            for attempt in range(3):
                settings = ClientSettings(cache_dir=folder / f"cache{attempt}")
                with ConfigClient(base, CHIP_NAME, settings=settings) as client:
                    started = time.perf_counter()
                    count = client.prefetch()
                    prefetch_s.append(time.perf_counter() - started)
            with ConfigClient(base, CHIP_NAME, settings=ClientSettings(cache_dir=folder / "cache")) as client:
                client.prefetch()
                report = {
                    "benchmark": "lookup_latency",
                    "hit": measure_hits(client, 1024, args.batches),
                    "prefetch": {
                        "configs": count,
                        "median_s": statistics.median(prefetch_s),
                        "runs_s": prefetch_s,
                    },
                    "launches": measure_launches(client, args.launches),
                    "down_server": measure_down(client, folder),
                }
        finally:
            server.terminate()
            server.wait(timeout=30)
    json.dump(report, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
