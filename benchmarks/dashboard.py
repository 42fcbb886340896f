"""Server time of every dashboard page on a big store: 10,000 best configs, 200,000 trials.

The store (SQLite by default, ``--db postgresql://...`` for PostgreSQL) is filled with
SQLAlchemy core inserts, shaped like a fleet's: five kernels on four chips, each best config
with its job, one to three promotions and two software versions per chip (some bests stale);
one job of 5,000 trials and the rest of the trials spread over the other jobs (a few invalid and
failed, three validation runs per job); 2,000 misses; workers online; jobs in every state.

Each page is requested in this process through the app's ASGI interface (no network: the time
is the server's), after warm-up loads, ``--repeats`` times in an interleaved round (page A, B, C,
…, then again), so drift hits every page alike. Prints one JSON document: per page, its status,
median and p95 ms and bytes; the goal (every page ≤ 150 ms, the 5,000-trial job page included)
and whether each page meets it.

Run from the repository root: ``.venv/bin/python -m benchmarks.dashboard [--repeats 20]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import insert

from tiletune.kernels.registry import all_kernels
from tiletune.kernels.spec import KernelSpec
from tiletune.service.app import create_app
from tiletune.service.database import make_engine
from tiletune.service.migrate import upgrade
from tiletune.service.models import (
    BestConfigRow,
    ChipRow,
    JobRow,
    MissRow,
    PromotionRow,
    SoftwareRow,
    SweepRow,
    TrialRow,
    WorkerRow,
)
from tiletune.service.settings import Settings

GOAL_MS = 150.0
CHIPS = (
    ("cuda/NVIDIA H200/sm_90", "cuda"),
    ("cuda/NVIDIA A100-SXM4-80GB/sm_80", "cuda"),
    ("npu/Ascend910B2", "npu"),
    ("cpu/Intel Xeon (AVX-512, AMX)/2c", "cpu"),
)
KERNELS = ("matmul", "softmax", "rms_norm", "add", "fused_attention")
BIG_JOB_TRIALS = 5_000
VALIDATIONS = 3
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def shapes_of(spec: KernelSpec, count: int, rng: random.Random) -> list[dict[str, int]]:
    """``count`` distinct shapes of ``spec`` (its canonical key unique).

    Sizes are multiples of 64 up to 4,096 (of 256 up to 2**24 for a kernel of one size dim, which
    has no other way to make thousands of keys); attention keeps realistic heads and head dims.
    """
    sizes = [d for d in spec.dims if not d.categorical]
    step, most = (256, 65_536) if len(sizes) == 1 else (64, 64)
    seen: dict[str, dict[str, int]] = {}
    for _ in range(100 * count):
        if len(seen) == count:
            break
        shape = {d.name: rng.choice(d.choices or [step * rng.randint(1, most)]) for d in spec.dims}
        if "heads" in shape:
            shape.update(batch=rng.choice((1, 2, 4)), heads=rng.choice((8, 16)))
            shape.update(head_dim=rng.choice((64, 128)))
        seen.setdefault(spec.canonical_shape(shape), shape)
    else:
        raise ValueError(f"could not draw {count} distinct shapes of {spec.name}")
    return list(seen.values())


def config_of(spec: KernelSpec, shape: dict[str, int], rng: random.Random) -> dict[str, int]:
    """A config drawn from the knob values of ``shape``."""
    return {name: rng.choice(values) for name, values in spec.knob_values(shape).items()}


class Filler:
    """Rows built in memory, then inserted per table in batches."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.rows: dict[Any, list[dict[str, Any]]] = {}
        self.ids: dict[Any, int] = {}

    def add(self, table: Any, **row: Any) -> int:
        """Queue one row of ``table`` with the next id; returns the id."""
        row_id = self.ids.get(table, 0) + 1
        self.ids[table] = row_id
        self.rows.setdefault(table, []).append({"id": row_id, **row})
        return row_id

    def write(self, url: str) -> None:
        """Insert every queued row (parents first)."""
        engine = make_engine(url)
        order = (
            ChipRow,
            SoftwareRow,
            WorkerRow,
            SweepRow,
            JobRow,
            TrialRow,
            BestConfigRow,
            PromotionRow,
            MissRow,
        )
        with engine.begin() as connection:
            for model in order:
                rows = self.rows.get(model, [])
                for start in range(0, len(rows), 5_000):
                    connection.execute(insert(model), rows[start : start + 5_000])
        engine.dispose()


def fill(url: str, best_configs: int, trials: int, misses: int, seed: int = 0) -> dict[str, Any]:
    """Fill an empty, migrated store; returns what the pages are asked about."""
    filler = Filler(seed)
    rng = filler.rng
    specs = all_kernels()
    chips: dict[str, tuple[int, list[int]]] = {}
    for name, kind in CHIPS:
        chip_id = filler.add(
            ChipRow,
            name=name,
            kind=kind,
            local_memory_bytes=192 * 1024,
            max_buffer_num=4,
            alignment_bytes=32,
            created_at=NOW,
            updated_at=NOW,
        )
        software = [
            filler.add(
                SoftwareRow,
                chip_id=chip_id,
                fingerprint=json.dumps({"torch": version}, sort_keys=True),
                first_seen_at=NOW - timedelta(days=30 - 20 * n),
            )
            for n, version in enumerate(("2.12.0", "2.13.0"))
        ]
        chips[name] = (chip_id, software)
        for n in range(4):
            filler.add(
                WorkerRow,
                name=f"{kind}-worker-{n}",
                chip_id=chip_id,
                software_id=software[-1],
                backends=["torch"],
                kernels=list(KERNELS),
                kernel_versions=None,
                token_id=None,
                registered_at=NOW,
                last_seen_at=NOW - timedelta(seconds=n),
            )
    sweep_id = filler.add(
        SweepRow, name="fleet", kernels=list(KERNELS), request={}, owner_token_id=None, created_at=NOW
    )
    per_kernel_chip = best_configs // (len(KERNELS) * len(CHIPS))
    keys = []
    for kernel in KERNELS:
        spec = specs[kernel]
        for shape in shapes_of(spec, per_kernel_chip, rng):
            for chip_name in chips:
                keys.append((spec, shape, chip_name))
    others, left = divmod(trials - VALIDATIONS * len(keys) - BIG_JOB_TRIALS, max(1, len(keys) - 1))
    counts = [BIG_JOB_TRIALS] + [others + (n < left) for n in range(len(keys) - 1)]
    for index, (spec, shape, chip_name) in enumerate(keys[: len(keys) // 50]):  # jobs in other states
        state = ("queued", "running", "failed", "cancelled")[index % 4]
        _job(filler, sweep_id, spec, shape, chips[chip_name][0], 0, state)
    big_job = filler.ids[JobRow] + 1
    for (spec, shape, chip_name), count in zip(keys, counts, strict=True):
        chip_id, software = chips[chip_name]
        job_id, best = _job(filler, sweep_id, spec, shape, chip_id, count, "done")
        if best is None:
            continue
        config, best_ms, default_ms, trial_id = best
        software_id = software[-1] if rng.random() < 0.9 else software[0]
        key = {
            "kernel": spec.name,
            "kernel_version": spec.version,
            "shape_key": spec.canonical_shape(shape),
            "dtype": "float32",
            "chip_id": chip_id,
        }
        filler.add(
            BestConfigRow,
            **key,
            shape=shape,
            config=config,
            median_ms=best_ms,
            default_config=config,
            default_ms=default_ms,
            job_id=job_id,
            trial_id=trial_id,
            software_id=software_id,
            promoted_at=NOW,
        )
        previous = None
        for step in range(rng.randint(1, 3), 0, -1):
            median = best_ms * (1 + 0.1 * (step - 1))
            filler.add(
                PromotionRow,
                **key,
                config=config,
                median_ms=median,
                default_ms=default_ms,
                previous_ms=previous,
                job_id=job_id,
                trial_id=trial_id,
                software_id=software[0] if step > 1 else software_id,  # earlier bests: older software
                promoted_at=NOW - timedelta(days=step),
            )
            previous = median
    per_cell = misses // (len(KERNELS) * len(CHIPS))
    for kernel in KERNELS:
        spec = specs[kernel]
        for chip_name in chips:
            for shape in shapes_of(spec, per_cell, random.Random(rng.random())):
                filler.add(
                    MissRow,
                    kernel=spec.name,
                    kernel_version=spec.version,
                    shape=shape,
                    shape_key=spec.canonical_shape(shape),
                    dtype="float32",
                    chip_name=chip_name,
                    chip_id=chips[chip_name][0],
                    count=rng.randint(1, 500),
                    last_match="nearest",
                    job_id=None,
                    first_seen_at=NOW,
                    last_seen_at=NOW,
                )
    filler.write(url)
    first_spec, first_shape, first_chip = keys[0]
    return {
        "big_job": big_job,
        "small_job": big_job + 1,
        "kernel": first_spec.name,
        "shape_key": first_spec.canonical_shape(first_shape),
        "chips": (first_chip, CHIPS[1][0]),
        "counts": {model.__tablename__: len(rows) for model, rows in filler.rows.items()},
    }


def _job(  # noqa: PLR0917 (one call site; the job's parts)
    filler: Filler,
    sweep_id: int,
    spec: KernelSpec,
    shape: dict[str, int],
    chip_id: int,
    count: int,
    state: str,
) -> tuple[int, tuple[dict[str, int], float, float, int] | None]:
    """A job with ``count`` search trials (and validations when done); its best when it has one."""
    rng = filler.rng
    default_ms = rng.uniform(0.05, 50.0)
    job_id = filler.ids.get(JobRow, 0) + 1
    best: tuple[dict[str, int], float, float, int] | None = None
    measured = 0
    started = NOW - timedelta(hours=2)
    for number in range(count if state != "queued" else 0):
        config = config_of(spec, shape, rng)
        outcome = rng.random()
        trial_state = "measured" if outcome > 0.08 else ("invalid" if outcome > 0.03 else "failed")
        median = default_ms * rng.uniform(0.4, 2.0) if trial_state == "measured" else None
        told = started + timedelta(seconds=number)
        trial_id = filler.add(
            TrialRow,
            job_id=job_id,
            number=number,
            lease_id=None,
            phase="search",
            config=config,
            state=trial_state,
            median_ms=median,
            p10_ms=median and median * 0.97,
            p90_ms=median and median * 1.04,
            min_ms=median and median * 0.95,
            samples=25 if median else None,
            pruned=False,
            reason=None
            if median
            else (
                "the tile does not fit the unified buffer"
                if trial_state == "invalid"
                else "RuntimeError: numerical mismatch"
            ),
            asked_at=told,
            told_at=told,
        )
        measured += median is not None
        if median is not None and (best is None or median < best[1]):
            best = (config, median, default_ms, trial_id)
    if state == "done" and best is not None:
        for _ in range(VALIDATIONS):
            filler.add(
                TrialRow,
                job_id=job_id,
                number=None,
                lease_id=None,
                phase="validate",
                config=best[0],
                state="validated",
                median_ms=best[1],
                p10_ms=best[1],
                p90_ms=best[1],
                min_ms=best[1],
                samples=40,
                pruned=False,
                reason=None,
                asked_at=NOW,
                told_at=NOW,
            )
    filler.add(
        JobRow,
        sweep_id=sweep_id,
        kernel=spec.name,
        kernel_version=spec.version,
        shape=shape,
        shape_key=spec.canonical_shape(shape),
        dtype="float32",
        chip_target="*",
        chip_id=chip_id,
        backend="torch",
        strategy="tpe",
        trials=max(count, 40),
        max_time_s=None,
        patience=None,
        seed=0,
        workers_per_job=1,
        validate_top=3,
        force=False,
        state=state,
        active_leases=int(state == "running"),
        validator_lease_id=None,
        lease_failures=0,
        search_seq=count,
        failure_reasons=[],
        default_config=best[0] if best else None,
        completed=measured,
        invalid=0,
        failed=0,
        best_ms=best[1] if best else None,
        best_config=best[0] if best else None,
        default_ms=default_ms,
        created_at=started,
        updated_at=NOW,
        finished_at=NOW if state == "done" else None,
    )
    return job_id, best if state == "done" else None


def pages(about: dict[str, Any]) -> dict[str, str]:
    """The page URLs to time, by name."""
    kernel, shape_key = about["kernel"], about["shape_key"]
    chip_a, chip_b = about["chips"]
    return {
        "overview": "/",
        "overview_download": "/?format=csv&table=coverage",
        "jobs": "/jobs",
        "jobs_done_page_20": "/jobs?state=done&page=20",
        "job_5000_trials": f"/jobs/{about['big_job']}",
        "job_5000_live_fragment": f"/jobs/{about['big_job']}/live",
        "job_small": f"/jobs/{about['small_job']}",
        "kernel": f"/kernels/{kernel}",
        "kernel_sorted_page_10": f"/kernels/{kernel}?sort=-speedup&page=10",
        "kernel_filtered": f"/kernels/{kernel}?chip={chip_a}&q=512",
        "shape": f"/kernels/{kernel}/shapes/{shape_key}?dtype=float32",
        "kernel_500_rows": f"/kernels/{kernel}?per_page=500",
        "compare_chips": f"/compare?a={chip_a}&b={chip_b}",
        "compare_software": f"/compare?chip={chip_a}&software_a=1&software_b=2",
        "misses": "/misses",
        "misses_all": "/misses?show=all&page=5",
        "docs": "/docs",
        "metrics": "/metrics",
    }


async def time_pages(url: str, urls: dict[str, str], repeats: int, warmup: int) -> dict[str, Any]:
    """Per page: status, bytes, median and p95 ms over ``repeats`` interleaved rounds."""
    app = create_app(Settings(db_url=url, open_reads=True), reaper=False)
    samples: dict[str, list[float]] = {name: [] for name in urls}
    status: dict[str, int] = {}
    size: dict[str, int] = {}
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://dashboard") as client:
            for round_ in range(warmup + repeats):
                for name, path in urls.items():
                    started = time.perf_counter()
                    response = await client.get(path)
                    elapsed = (time.perf_counter() - started) * 1000
                    status[name], size[name] = response.status_code, len(response.content)
                    if round_ >= warmup:
                        samples[name].append(elapsed)
    results = {}
    for name, times in samples.items():
        times.sort()
        p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
        results[name] = {
            "path": urls[name],
            "status": status[name],
            "bytes": size[name],
            "median_ms": round(statistics.median(times), 2),
            "p95_ms": round(p95, 2),
            "min_ms": round(times[0], 2),
            "meets_goal": status[name] == 200 and statistics.median(times) <= GOAL_MS and p95 <= GOAL_MS,
        }
    return results


def main(argv: list[str] | None = None) -> int:
    """Fill a store, time every page, print JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", help="a store URL (default: a fresh SQLite file); it must be empty")
    parser.add_argument("--best-configs", type=int, default=10_000)
    parser.add_argument("--trials", type=int, default=200_000)
    parser.add_argument("--misses", type=int, default=2_000)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        url = args.db or f"sqlite:///{Path(folder) / 'dashboard.db'}"
        upgrade(url)
        started = time.perf_counter()
        about = fill(url, args.best_configs, args.trials, args.misses)
        fill_s = time.perf_counter() - started
        results = asyncio.run(time_pages(url, pages(about), args.repeats, args.warmup))
    document = {
        "benchmark": "dashboard",
        "store": {"url": url.split("://")[0], "fill_s": round(fill_s, 1), "rows": about["counts"]},
        "goal_ms": GOAL_MS,
        "repeats": args.repeats,
        "pages": results,
        "all_meet_goal": all(page["meets_goal"] for page in results.values()),
    }
    json.dump(document, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
