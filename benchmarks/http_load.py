"""HTTP load on a real ``tiletune server``: lookups, exports, revalidations and a mixed load, against wrk.

One ``tiletune server`` process (uvicorn, one process, as operators run it) on a fresh SQLite
file (or ``--db``) holding ``--configs`` best configs of one chip (imported in bundles of
``--chunk``, each timed), pinned to ``--server-core``; the load comes from ``wrk`` (Lua scripts:
random keys, the bearer token) pinned to ``--client-core``. The same wrk runs, in the same run,
against a trivial FastAPI ``async def`` endpoint served by uvicorn the same way (one process,
same core, access log on), so every figure is also a ratio to the framework's floor on this
machine.

Scenarios, ``--duration`` seconds each:

- ``trivial``: ``GET /trivial`` of the trivial app, ``--connections`` (64);
- ``lookups``: random exact single-key lookups (``GET /v1/configs/add?shape=n=...``), 64;
- ``exports``: the chip's bulk export compressed (``Accept-Encoding: gzip``), ``--export-connections`` (200);
- ``revalidate``: the export with ``If-None-Match`` of its ETag (``304``), ``--revalidate-connections`` (1:
  the time one client's periodic refresh costs);
- ``mixed``: 64 clients at once: lookups (40), exports (4), revalidations (4), sweep submissions
  (4, one job of 4 trials each, on a second chip) and worker traffic (12 simulated workers in a
  Python process of their own on the client core: lease, ask, tell, complete, release, with
  made-up measurements), so jobs are tuned and promoted while the reads run.

Prints one JSON document: per scenario and endpoint requests/s, p50 / p99 latency (ms), errors
(wrk's socket errors and non-2xx/3xx answers; for the workers any unexpected status), the ratio to
the trivial endpoint's requests/s, and each goal with its figure and ``pass``.

Needs ``wrk`` (``make setup`` installs it as root; ``apt-get install wrk``) and ``taskset``.
Run: ``.venv/bin/python benchmarks/http_load.py [--duration 10] [--configs 10000] [--db URL]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from tiletune.client.wire import BestConfigPublic, ConfigBundle

CHIP_NAME = "cpu/Benchmark Chip/2c"
WORKER_CHIP_NAME = "cpu/Benchmark Tuning Chip/2c"
LOCAL_MEMORY = 1 << 20
#: The admin token of the benchmark's server: a fresh one per run (its worker process is handed it).
TOKEN = os.environ.get("TILETUNE_BENCH_TOKEN") or "tt_" + secrets.token_urlsafe(32)
AUTH = {"Authorization": f"Bearer {TOKEN}"}
#: wrk's per-request timeout: long, so a slow answer counts as slow, not as an error.
WRK_TIMEOUT_S = 30
#: The mixed scenario's clients per endpoint (64 in all).
MIXED = {"lookups": 40, "exports": 4, "revalidate": 4, "sweeps": 4, "workers": 12}
MARKER = "WRK_JSON "

DONE_LUA = """
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '%s{"requests":%d,"duration_us":%d,"bytes":%d,"connect":%d,"read":%d,"write":%d,"status":%d,' ..
    '"timeout":%d,"p50_us":%.0f,"p99_us":%.0f,"max_us":%.0f}\\n',
    "MARKER", summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status,
    e.timeout, latency:percentile(50), latency:percentile(99), latency.max))
end
""".replace("MARKER", MARKER)

TRIVIAL_APP = """
from fastapi import FastAPI

app = FastAPI()


@app.get("/trivial")
async def trivial() -> dict[str, str]:
    return {"status": "ok"}
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def pinned(core: int, command: Sequence[str]) -> list[str]:
    """``command`` under ``taskset`` on one core."""
    return ["taskset", "-c", str(core), *command]


def wait_until_up(url: str, process: subprocess.Popen[bytes], log: Path, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url} exited with {process.returncode}: {log.read_text()[-2000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {timeout_s:g} s: {log.read_text()[-2000:]}")


def start_server(folder: Path, db_url: str, port: int, core: int) -> subprocess.Popen[bytes]:
    """``tiletune server`` on one core, its admin token :data:`TOKEN`, once ``/healthz`` answers; the
    sweeps of the mixed load unlimited (``TILETUNE_SWEEPS_PER_S=0``: its cost is measured, not its limit)."""
    tiletune = str(Path(sys.executable).parent / "tiletune")
    env = {**os.environ, "TILETUNE_ADMIN_TOKEN": TOKEN, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env["TILETUNE_SWEEPS_PER_S"] = "0"
    env.pop("TILETUNE_SERVER", None)
    log = folder / "server.log"
    command = pinned(core, [tiletune, "server", "--db", db_url, "--port", str(port)])
    server = subprocess.Popen(command, stdout=log.open("ab"), stderr=subprocess.STDOUT, env=env)
    wait_until_up(f"http://127.0.0.1:{port}/healthz", server, log)
    return server


def start_trivial(folder: Path, port: int, core: int) -> subprocess.Popen[bytes]:
    """The trivial app under uvicorn as ``tiletune server`` runs it (one process, access log on)."""
    (folder / "trivial_app.py").write_text(TRIVIAL_APP)
    log = folder / "trivial.log"
    command = pinned(
        core,
        [sys.executable, "-m", "uvicorn", "trivial_app:app", "--port", str(port), "--log-level", "info"],
    )
    server = subprocess.Popen(command, cwd=folder, stdout=log.open("ab"), stderr=subprocess.STDOUT)
    wait_until_up(f"http://127.0.0.1:{port}/trivial", server, log)
    return server


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def register(http: httpx.Client, chip: str, name: str) -> int:
    worker = {
        "name": name,
        "chip": {"name": chip, "kind": "cpu", "local_memory_bytes": LOCAL_MEMORY},
        "backends": ["torch"],
        "software": {"torch": "bench"},
    }
    response = http.post("/v1/workers", json=worker)
    response.raise_for_status()
    worker_id: int = response.json()["id"]
    return worker_id


def sizes_of(count: int) -> list[int]:
    return [1024 + 16 * i for i in range(count)]


def fill(http: httpx.Client, count: int, chunk: int) -> list[float]:
    """Register the chips and import ``count`` best configs of ``add`` on :data:`CHIP_NAME`.

    Imported as bundles of ``chunk`` entries, one after another, as an operator loads a large
    store; the seconds each bundle took (an import's cost should follow its own size, not the
    store's).
    """
    register(http, CHIP_NAME, "bench-fill")
    register(http, WORKER_CHIP_NAME, "bench-fill")
    now = datetime.now(UTC)
    sizes = sizes_of(count)
    seconds = []
    for start in range(0, count, chunk):
        started = time.perf_counter()
        entries = [
            BestConfigPublic(
                kernel="add",
                kernel_version=1,
                shape={"n": n},
                shape_key=f"n={n}",
                dtype="float32",
                chip=CHIP_NAME,
                config={"tile_size": 256, "buffer_num": 2, "pipeline_depth": 2},
                median_ms=1.0,
                default_ms=1.5,
                promoted_at=now,
                software={"torch": "bench"},
            )
            for n in sizes[start : start + chunk]
        ]
        bundle = ConfigBundle(configs=entries).sealed()
        response = http.post(
            "/v1/configs/import",
            content=bundle.model_dump_json(),
            headers={"Content-Type": "application/json"},
            timeout=600,
        )
        response.raise_for_status()
        seconds.append(time.perf_counter() - started)
    return seconds


# -- wrk ------------------------------------------------------------------------------------------


def lua_headers(headers: dict[str, str]) -> str:
    return "".join(f"wrk.headers[{json.dumps(k)}] = {json.dumps(v)}\n" for k, v in headers.items())


def lookup_lua(count: int) -> str:
    chip = urllib.parse.quote(CHIP_NAME, safe="")
    return (
        lua_headers(AUTH)
        + f"""
request = function()
  local n = 1024 + 16 * math.random(0, {count - 1})
  return wrk.format("GET", "/v1/configs/add?shape=n%3D" .. n .. "&chip={chip}&match=exact")
end
"""
        + DONE_LUA
    )


def export_lua(headers: dict[str, str]) -> str:
    return lua_headers({**AUTH, "Accept-Encoding": "gzip", **headers}) + DONE_LUA


def sweep_lua() -> str:
    chip = json.dumps(WORKER_CHIP_NAME)
    return (
        lua_headers({**AUTH, "Content-Type": "application/json"})
        + f"""
wrk.method = "POST"
request = function()
  local n = 4096 + math.random(0, 100000000)
  local body = '{{"kernel":"add","shapes":[{{"n":' .. n .. '}}],"trials":4,"chips":[' .. '{chip}' .. ']}}'
  return wrk.format("POST", "/v1/sweeps", nil, body)
end
"""
        + DONE_LUA
    )


def wrk_command(
    folder: Path, name: str, script: str, *, url: str, connections: int, duration: float, core: int
) -> list[str]:
    path = folder / f"{name}.lua"
    path.write_text(script)
    wrk = [
        "wrk",
        "-t1",
        f"-c{connections}",
        f"-d{max(1, round(duration))}s",
        f"--timeout={WRK_TIMEOUT_S}s",
        "-s",
        str(path),
        url,
    ]
    return pinned(core, wrk)


def wrk_result(output: str, connections: int) -> dict[str, Any]:
    line = next((line for line in output.splitlines() if line.startswith(MARKER)), None)
    if line is None:
        raise RuntimeError(f"wrk printed no summary:\n{output}")
    raw = json.loads(line[len(MARKER) :])
    errors = sum(raw[k] for k in ("connect", "read", "write", "status", "timeout"))
    seconds = raw["duration_us"] / 1e6
    return {
        "connections": connections,
        "requests": raw["requests"],
        "requests_per_s": round(raw["requests"] / seconds, 1),
        "p50_ms": round(raw["p50_us"] / 1e3, 2),
        "p99_ms": round(raw["p99_us"] / 1e3, 2),
        "max_ms": round(raw["max_us"] / 1e3, 2),
        "errors": errors,
        "errors_by_kind": {k: raw[k] for k in ("connect", "read", "write", "status", "timeout") if raw[k]},
        "mb_per_s": round(raw["bytes"] / seconds / 1e6, 2),
    }


def run_wrk(
    folder: Path, name: str, script: str, *, url: str, connections: int, duration: float, core: int
) -> Any:
    """One wrk run of ``script`` against ``url``; its summary (see :func:`wrk_result`)."""
    command = wrk_command(
        folder, name, script, url=url, connections=connections, duration=duration, core=core
    )
    done = subprocess.run(command, capture_output=True, text=True, timeout=duration + 120, check=True)
    return wrk_result(done.stdout, connections)


# -- simulated workers (the mixed scenario's worker traffic) --------------------------------------


def measurement(ms: float) -> dict[str, Any]:
    return {"median_ms": ms, "p10_ms": ms * 0.95, "p90_ms": ms * 1.05, "min_ms": ms * 0.9, "samples": 10}


async def one_worker(
    http: httpx.AsyncClient, worker_id: int, stop_at: float, seed: int, timings: dict[str, list[float]]
) -> dict[str, int]:
    rng = random.Random(seed)
    errors: dict[str, int] = {}

    async def call(endpoint: str, path: str, expect: tuple[int, ...], **kwargs: Any) -> httpx.Response | None:
        started = time.perf_counter()
        try:
            response = await http.post(path, **kwargs)
        except httpx.HTTPError:
            errors[endpoint] = errors.get(endpoint, 0) + 1
            return None
        timings.setdefault(endpoint, []).append((time.perf_counter() - started) * 1e3)
        if response.status_code not in expect:
            errors[endpoint] = errors.get(endpoint, 0) + 1
            return None
        return response

    while time.perf_counter() < stop_at:
        leased = await call("lease", "/v1/leases", (201, 204), json={"worker_id": worker_id})
        if leased is None or leased.status_code == 204:
            await asyncio.sleep(0.05)
            continue
        lease = {"X-Lease-Token": leased.json()["token"]}
        while time.perf_counter() < stop_at:
            asked = await call("ask", "/v1/lease/ask", (200,), headers=lease, params={"n": 2})
            if asked is None:
                break
            answer = asked.json()
            if answer["phase"] == "search":
                outcomes = [
                    {"trial_id": task["trial_id"], "measurement": measurement(rng.uniform(0.5, 2.0))}
                    for task in answer["tasks"]
                ]
                if (
                    await call("tell", "/v1/lease/tell", (200,), headers=lease, json={"outcomes": outcomes})
                    is None
                ):
                    break
            elif answer["phase"] == "validate":
                results = [
                    {"config": config, "measurement": measurement(rng.uniform(0.5, 2.0))}
                    for config in answer["validate_configs"]
                ]
                await call("complete", "/v1/lease/complete", (200,), headers=lease, json={"results": results})
                break
            elif answer["phase"] == "wait":
                await asyncio.sleep(0.05)
            else:
                await call("release", "/v1/lease/release", (200,), headers=lease, json={"reason": "done"})
                break
    return errors


async def worker_traffic(base: str, clients: int, duration: float) -> dict[str, Any]:
    timings: dict[str, list[float]] = {}
    async with httpx.AsyncClient(base_url=base, headers=AUTH, timeout=WRK_TIMEOUT_S) as http:
        ids = []
        for i in range(clients):
            worker = {
                "name": f"bench-worker-{i}",
                "chip": {"name": WORKER_CHIP_NAME, "kind": "cpu", "local_memory_bytes": LOCAL_MEMORY},
                "backends": ["torch"],
                "software": {"torch": "bench"},
            }
            response = await http.post("/v1/workers", json=worker)
            response.raise_for_status()
            ids.append(response.json()["id"])
        started = time.perf_counter()
        stop_at = started + duration
        results = await asyncio.gather(
            *(one_worker(http, wid, stop_at, i, timings) for i, wid in enumerate(ids))
        )
        wall = time.perf_counter() - started
    report: dict[str, Any] = {}
    for endpoint, latencies in sorted(timings.items()):
        latencies.sort()
        report[endpoint] = {
            "clients": clients,
            "requests": len(latencies),
            "requests_per_s": round(len(latencies) / wall, 1),
            "p50_ms": round(statistics.median(latencies), 2),
            "p99_ms": round(latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 2),
            "max_ms": round(latencies[-1], 2),
            "errors": sum(r.get(endpoint, 0) for r in results),
        }
    return report


# -- scenarios ------------------------------------------------------------------------------------


def export_etag(base: str) -> str:
    response = httpx.get(
        f"{base}/v1/configs",
        params={"chip": CHIP_NAME},
        headers={**AUTH, "Accept-Encoding": "gzip"},
        timeout=60,
    )
    response.raise_for_status()
    return response.headers["etag"]


def mixed(folder: Path, base: str, args: argparse.Namespace, count: int) -> dict[str, Any]:
    """Every endpoint's wrk at once, and the worker traffic in a process of its own (same core)."""
    export_url = f"{base}/v1/configs?chip={urllib.parse.quote(CHIP_NAME, safe='')}"
    etag = export_etag(base)
    scripts = {
        "lookups": (lookup_lua(count), f"{base}/"),
        "exports": (export_lua({}), export_url),
        "revalidate": (export_lua({"If-None-Match": etag}), export_url),
        "sweeps": (sweep_lua(), f"{base}/"),
    }
    workers_out = folder / "workers.json"
    workers = subprocess.Popen(
        pinned(
            args.client_core,
            [sys.executable, __file__, "--worker-traffic", base, str(MIXED["workers"]), str(args.duration)],
        ),
        stdout=workers_out.open("w"),
        env={**os.environ, "TILETUNE_BENCH_TOKEN": TOKEN},
    )
    time.sleep(1.0)  # the workers register first
    runs = {
        name: subprocess.Popen(
            wrk_command(
                folder,
                f"mixed-{name}",
                script,
                url=url,
                connections=MIXED[name],
                duration=args.duration,
                core=args.client_core,
            ),
            stdout=subprocess.PIPE,
            text=True,
        )
        for name, (script, url) in scripts.items()
    }
    endpoints = {
        name: wrk_result(run.communicate(timeout=args.duration + 120)[0], MIXED[name])
        for name, run in runs.items()
    }
    workers.wait(timeout=args.duration + 120)
    endpoints.update({f"worker_{k}": v for k, v in json.loads(workers_out.read_text()).items()})
    return {"clients": sum(MIXED.values()), "endpoints": endpoints}


def goals(report: dict[str, Any]) -> list[dict[str, Any]]:
    scenarios = report["scenarios"]
    trivial = scenarios["trivial"]["requests_per_s"]
    lookups, exports, revalidate = scenarios["lookups"], scenarios["exports"], scenarios["revalidate"]
    found = [
        ("lookups: requests/s >= 0.5 x trivial", lookups["requests_per_s"] / trivial, ">=", 0.5),
        ("lookups: p99 ms <= 50 at 64 connections", lookups["p99_ms"], "<=", 50.0),
        ("lookups: errors == 0", lookups["errors"], "<=", 0),
        ("exports (gzip): requests/s >= 50 at 200 connections", exports["requests_per_s"], ">=", 50.0),
        ("exports (gzip): errors == 0", exports["errors"], "<=", 0),
        ("revalidate (304): p50 ms <= 5", revalidate["p50_ms"], "<=", 5.0),
        ("revalidate (304): errors == 0", revalidate["errors"], "<=", 0),
    ]
    for name, endpoint in scenarios["mixed"]["endpoints"].items():
        found.append((f"mixed {name}: p99 ms <= 100", endpoint["p99_ms"], "<=", 100.0))
        found.append((f"mixed {name}: errors == 0", endpoint["errors"], "<=", 0))
    return [
        {
            "goal": goal,
            "value": round(value, 3),
            "pass": value >= bound if op == ">=" else value <= bound,
        }
        for goal, value, op, bound in found
    ]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every scenario, in one run; the report (see the module docstring)."""
    for tool in ("wrk", "taskset"):
        if shutil.which(tool) is None:
            raise SystemExit(
                f"{tool} is not installed (make setup installs wrk as root: apt-get install wrk)"
            )
    scenarios: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)

        def load(name: str, script: str, url: str, connections: int, duration: float = args.duration) -> Any:
            return run_wrk(
                folder,
                name,
                script,
                url=url,
                connections=connections,
                duration=duration,
                core=args.client_core,
            )

        trivial_port = free_port()
        trivial = start_trivial(folder, trivial_port, args.server_core)
        try:
            trivial_url = f"http://127.0.0.1:{trivial_port}/trivial"
            load("warm", DONE_LUA, trivial_url, 8, 1)
            scenarios["trivial"] = load("trivial", DONE_LUA, trivial_url, args.connections)
        finally:
            stop(trivial)
        db_url = args.db or f"sqlite:///{folder / 'load.db'}"
        port = free_port()
        server = start_server(folder, db_url, port, args.server_core)
        try:
            base = f"http://127.0.0.1:{port}"
            with httpx.Client(base_url=base, headers=AUTH, timeout=60) as http:
                fill_s = fill(http, args.configs, args.chunk)
            export_url = f"{base}/v1/configs?chip={urllib.parse.quote(CHIP_NAME, safe='')}"
            load("warm", lookup_lua(args.configs), f"{base}/", 8, 2)
            scenarios["lookups"] = load("lookups", lookup_lua(args.configs), f"{base}/", args.connections)
            export_etag(base)  # built once before the storm: what the storm measures is serving it
            scenarios["exports"] = load("exports", export_lua({}), export_url, args.export_connections)
            revalidate = export_lua({"If-None-Match": export_etag(base)})
            scenarios["revalidate"] = load("revalidate", revalidate, export_url, args.revalidate_connections)
            with httpx.Client(base_url=base, headers=AUTH, timeout=60) as http:
                gz = http.get("/v1/configs", params={"chip": CHIP_NAME}, headers={"Accept-Encoding": "gzip"})
                export_bytes = {"gzip": int(gz.headers.get("content-length", 0)), "identity": len(gz.content)}
            scenarios["mixed"] = mixed(folder, base, args, args.configs)
        finally:
            stop(server)
    trivial_rps = scenarios["trivial"]["requests_per_s"]
    for name in ("lookups", "exports", "revalidate"):
        scenarios[name]["ratio_to_trivial"] = round(scenarios[name]["requests_per_s"] / trivial_rps, 3)
    for endpoint in scenarios["mixed"]["endpoints"].values():
        endpoint["ratio_to_trivial"] = round(endpoint["requests_per_s"] / trivial_rps, 3)
    report: dict[str, Any] = {
        "benchmark": "http_load",
        "configs": args.configs,
        "fill_s": round(sum(fill_s), 1),
        "chunk": args.chunk,
        "chunk_import_s": [round(seconds, 2) for seconds in fill_s],
        "export_bytes": export_bytes,
        "database": "postgresql" if args.db and args.db.startswith("postgres") else "sqlite",
        "duration_s": args.duration,
        "cpu_count": os.cpu_count(),
        "server_core": args.server_core,
        "client_core": args.client_core,
        "scenarios": scenarios,
    }
    report["goals"] = goals(report)
    report["all_pass"] = all(goal["pass"] for goal in report["goals"])
    return report


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--worker-traffic":  # the mixed scenario's worker process
        report = asyncio.run(worker_traffic(sys.argv[2], int(sys.argv[3]), float(sys.argv[4])))
        json.dump(report, sys.stdout)
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per scenario (default 10)")
    parser.add_argument("--configs", type=int, default=10_000, help="best configs stored (default 10000)")
    parser.add_argument(
        "--chunk", type=int, default=10_000, help="configs per imported bundle (default 10000)"
    )
    parser.add_argument("--db", default=None, help="database URL (default: a fresh SQLite file)")
    parser.add_argument("--connections", type=int, default=64, help="lookups' and trivial's connections (64)")
    parser.add_argument("--export-connections", type=int, default=200, help="exports' connections (200)")
    parser.add_argument("--revalidate-connections", type=int, default=1, help="304s' connections (1)")
    parser.add_argument("--server-core", type=int, default=0, help="the core the servers run on (0)")
    parser.add_argument("--client-core", type=int, default=1, help="the core wrk and the workers run on (1)")
    args = parser.parse_args()
    json.dump(run(args), sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
