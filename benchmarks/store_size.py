"""Lookups and imports as the store grows: the same load at 10,000, 100,000 (and 1,000,000) configs.

For each store size, a ``tiletune server`` process of its own (one process, pinned to
``--server-core``) on a fresh SQLite file, or a fresh PostgreSQL database with ``--postgres``,
filled by importing bundles of ``--chunk`` best configs one after another (each bundle's seconds
recorded: an import should cost its own size, not the store's). Then, in ``--rounds`` rounds, each
round visiting every size in turn (interleaved, so drift of the machine falls on every size
alike), ``wrk`` (pinned to ``--client-core``) sends random exact single-key lookups over
``--connections`` connections for ``--duration`` seconds; the servers not under load sit idle.

Prints one JSON document: per size, the import seconds per bundle, and per round requests/s, p50,
p99 and max latency (ms) and errors; the medians over rounds; and each size's ratios to the
smallest size's medians (requests/s and p99), with the goals (within 1.2x, no request over 1 s)
and whether each passed.

Needs ``wrk`` and ``taskset`` (as ``benchmarks/http_load.py``).
Run from the repository root:
``.venv/bin/python -m benchmarks.store_size [--sizes 10000,100000] [--postgres URL]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, make_url, text

from benchmarks.http_load import AUTH, fill, free_port, lookup_lua, run_wrk, start_server, stop

#: The goals: each size within this factor of the smallest's figures, and no request slower.
WITHIN = 1.2
MAX_REQUEST_MS = 1000.0


@contextmanager
def database(folder: Path, size: int, postgres: str | None) -> Iterator[str]:
    """A fresh database for one size: a SQLite file, or a PostgreSQL database dropped afterwards."""
    if postgres is None:
        yield f"sqlite:///{folder / f'store_{size}.db'}"
        return
    name = f"tiletune_store_{size}_{uuid.uuid4().hex[:8]}"
    admin = create_engine(postgres, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
        yield make_url(postgres).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def medians(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The median over rounds of each figure, the worst max and the errors summed."""
    return {
        "requests_per_s": round(statistics.median(r["requests_per_s"] for r in rounds), 1),
        "p50_ms": round(statistics.median(r["p50_ms"] for r in rounds), 2),
        "p99_ms": round(statistics.median(r["p99_ms"] for r in rounds), 2),
        "max_ms": max(r["max_ms"] for r in rounds),
        "errors": sum(r["errors"] for r in rounds),
    }


def not_ok(log: Path) -> dict[str, int]:
    """The lookups a server answered with another status than 200, by status (from its access log)."""
    found = Counter(re.findall(r'"GET /v1/configs/add" (\d{3}) ', log.read_text()))
    found.pop("200", None)
    return dict(sorted(found.items()))


def goals(sizes: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """Each larger size against the smallest: throughput and p99 within :data:`WITHIN`; every size:
    no request over :data:`MAX_REQUEST_MS`, no errors, each import bundle within :data:`WITHIN` of
    the first."""
    smallest = sizes[min(sizes)]["lookups"]
    found: list[tuple[str, float, float]] = []
    for size, figures in sorted(sizes.items()):
        lookups, imports = figures["lookups"], figures["import_s"]
        if size != min(sizes):
            slower = smallest["requests_per_s"] / lookups["requests_per_s"]
            found.append((f"{size}: smallest's requests/s / this one's <= {WITHIN}", slower, WITHIN))
            found.append(
                (f"{size}: p99 / smallest's <= {WITHIN}", lookups["p99_ms"] / smallest["p99_ms"], WITHIN)
            )
        found.append(
            (f"{size}: slowest import bundle / first <= {WITHIN}", max(imports) / imports[0], WITHIN)
        )
        found.append((f"{size}: max ms <= {MAX_REQUEST_MS:g}", lookups["max_ms"], MAX_REQUEST_MS))
        found.append((f"{size}: errors == 0", lookups["errors"], 0))
    return [{"goal": goal, "value": round(value, 3), "pass": value <= bound} for goal, value, bound in found]


def run(args: argparse.Namespace) -> dict[str, Any]:
    sizes = sorted(int(size) for size in args.sizes.split(","))
    figures: dict[int, dict[str, Any]] = {size: {"rounds": []} for size in sizes}
    with tempfile.TemporaryDirectory() as name, ExitStack() as stack:
        folder = Path(name)
        bases: dict[int, str] = {}
        for size in sizes:
            db_url = stack.enter_context(database(folder, size, args.postgres))
            port = free_port()
            served = folder / str(size)
            served.mkdir()
            server = start_server(served, db_url, port, args.server_core)
            stack.callback(stop, server)
            bases[size] = f"http://127.0.0.1:{port}"
            with httpx.Client(base_url=bases[size], headers=AUTH, timeout=600) as http:
                figures[size]["import_s"] = [round(s, 2) for s in fill(http, size, args.chunk)]
            print(f"{size}: imported in {sum(figures[size]['import_s']):.0f} s", file=sys.stderr, flush=True)
            url = f"{bases[size]}/"
            run_wrk(
                folder, "warm", lookup_lua(size), url=url, connections=8, duration=2, core=args.client_core
            )
        for _ in range(args.rounds):
            for size in sizes:
                figures[size]["rounds"].append(
                    run_wrk(
                        folder,
                        f"lookups_{size}",
                        lookup_lua(size),
                        url=f"{bases[size]}/",
                        connections=args.connections,
                        duration=args.duration,
                        core=args.client_core,
                    )
                )
        for size in sizes:
            figures[size]["lookups"] = medians(figures[size]["rounds"])
            figures[size]["lookups"]["not_ok_by_status"] = not_ok(folder / str(size) / "server.log")
    report: dict[str, Any] = {
        "benchmark": "store_size",
        "database": "postgresql" if args.postgres else "sqlite",
        "chunk": args.chunk,
        "connections": args.connections,
        "duration_s": args.duration,
        "rounds": args.rounds,
        "cpu_count": os.cpu_count(),
        "server_core": args.server_core,
        "client_core": args.client_core,
        "sizes": {str(size): figures[size] for size in sizes},
    }
    report["goals"] = goals(figures)
    report["all_pass"] = all(goal["pass"] for goal in report["goals"])
    return report


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="10000,100000", help="store sizes, comma-separated (10000,100000)")
    parser.add_argument("--chunk", type=int, default=10_000, help="configs per imported bundle (10000)")
    parser.add_argument("--postgres", default=None, help="a PostgreSQL URL whose user may create databases")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over the sizes (3)")
    parser.add_argument("--duration", type=float, default=8.0, help="seconds of load per size and round (8)")
    parser.add_argument("--connections", type=int, default=64, help="wrk's connections (64)")
    parser.add_argument("--server-core", type=int, default=0, help="the core the servers run on (0)")
    parser.add_argument("--client-core", type=int, default=1, help="the core wrk runs on (1)")
    json.dump(run(parser.parse_args()), sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
