"""Search quality on recorded tuning spaces: how close to the optimum, after how much of the space.

For each recorded space (see ``tiletune.tuner.replay``) and each strategy, runs
the search with several seeds against the replay device, each up to the largest
budget, and reports the fraction of the optimum reached (optimum time / best
time found) after each budget, a budget being a percentage of the valid space
in unique valid measurements (failures included). Also reports the sampler's
cost per asked config and the wall time. Goals (issue 2): ``tpe`` median
>= 0.99 and worst seed >= 0.97 at 5 %, and a better median than ``random`` on
every space at every budget.

Prints one JSON document on stdout, progress on stderr::

    python benchmarks/search_replay.py [--spaces gemm_RTX_3090,...] [--seeds 5]
        [--budgets 1,2,5,10] [--strategies tpe,random] [--jobs 2] [--batch 1]
        [--replay-dir DIR] [--tpe-options '{"local_share": 0.5}']
"""

# ruff: noqa: E402  (BLAS threads are limited before numpy is first imported)
from __future__ import annotations

import os

# One BLAS thread per process: the search's model solves small systems, and parallel
# jobs on a 2-core machine must not fight over threads. Set before numpy is imported.
for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import optuna

from tiletune.tuner.replay import ReplaySpace, load_replay, replay_spaces
from tiletune.tuner.search import STRATEGIES, Search, TpeOptions

GOAL_BUDGET_PCT = 5.0
GOAL_MEDIAN = 0.99
GOAL_WORST = 0.97


@dataclass(frozen=True)
class Task:
    """One search run: a space, a strategy and a seed, up to ``max_trials`` measurements."""

    space: str
    path: str
    strategy: str
    seed: int
    max_trials: int
    batch: int
    options: dict[str, Any]


@dataclass(frozen=True)
class Run:
    """What one run found: best time after each measurement and what asking cost."""

    task: Task
    history: list[float]
    asks: int
    ask_s: float
    tell_s: float
    wall_s: float
    counts: dict[str, int]


def run_task(task: Task) -> Run:
    """Search one recorded space with one strategy and seed; the replay device measures."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = load_replay(task.path)
    started = time.perf_counter()
    search = Search(
        space.search_space(),
        strategy=task.strategy,
        seed=task.seed,
        max_trials=task.max_trials,
        options=TpeOptions(**task.options),
    )
    asks, ask_s, tell_s = 0, 0.0, 0.0
    while not search.done:
        before = time.perf_counter()
        candidates = search.ask(task.batch)
        ask_s += time.perf_counter() - before
        asks += len(candidates)
        if not candidates:
            break
        before = time.perf_counter()
        for candidate in candidates:
            outcome = space.measure(candidate.config)
            search.tell(candidate.trial_id, outcome.time_ms, outcome.error)
        tell_s += time.perf_counter() - before
    wall_s = time.perf_counter() - started
    return Run(task, search.history, asks, ask_s, tell_s, wall_s, search.counts.as_dict())


def budget_trials(space: ReplaySpace, pct: float) -> int:
    """Unique valid measurements that make ``pct`` percent of the valid space (at least 1)."""
    return max(1, math.ceil(space.valid_count * pct / 100.0))


def fraction_at(run: Run, trials: int, optimum_ms: float) -> float:
    """Optimum time over the best time found within the first ``trials`` measurements (0 if none)."""
    if not run.history:
        return 0.0
    best = run.history[min(trials, len(run.history)) - 1]
    return optimum_ms / best if math.isfinite(best) else 0.0


def summarize_space(space: ReplaySpace, runs: list[Run], budgets: Sequence[float]) -> dict[str, Any]:
    """The JSON summary of one space: per strategy and budget, median and worst fraction."""
    by_strategy: dict[str, list[Run]] = {}
    for run in runs:
        by_strategy.setdefault(run.task.strategy, []).append(run)
    strategies = {
        strategy: summarize_strategy(space, sorted(group, key=lambda r: r.task.seed), budgets)
        for strategy, group in sorted(by_strategy.items())
    }
    summary: dict[str, Any] = {
        "kernel": space.kernel_name,
        "device": space.device_name,
        "product_size": space.product_size,
        "valid_configs": space.valid_count,
        "failed_configs": space.failed_count,
        "optimum_ms": space.optimum_ms,
        "budgets": {_pct(pct): budget_trials(space, pct) for pct in budgets},
        "strategies": strategies,
    }
    if "tpe" in strategies and "random" in strategies:
        summary["tpe_better_than_random"] = {
            _pct(pct): strategies["tpe"]["fraction"][_pct(pct)]["median"]
            > strategies["random"]["fraction"][_pct(pct)]["median"]
            for pct in budgets
        }
    if "tpe" in strategies and GOAL_BUDGET_PCT in budgets:
        at_goal = strategies["tpe"]["fraction"][_pct(GOAL_BUDGET_PCT)]
        summary["goal_5pct_met"] = at_goal["median"] >= GOAL_MEDIAN and at_goal["worst"] >= GOAL_WORST
    return summary


def summarize_strategy(space: ReplaySpace, runs: list[Run], budgets: Sequence[float]) -> dict[str, Any]:
    """Median and worst fraction of the optimum per budget, plus what the sampler cost."""
    fraction: dict[str, dict[str, Any]] = {}
    for pct in budgets:
        values = [fraction_at(run, budget_trials(space, pct), space.optimum_ms) for run in runs]
        fraction[_pct(pct)] = {
            "median": round(statistics.median(values), 4),
            "worst": round(min(values), 4),
            "per_seed": [round(value, 4) for value in values],
        }
    asks = sum(run.asks for run in runs)
    return {
        "seeds": [run.task.seed for run in runs],
        "fraction": fraction,
        "ask_ms_mean": round(1000 * sum(run.ask_s for run in runs) / max(1, asks), 3),
        "tell_ms_mean": round(1000 * sum(run.tell_s for run in runs) / max(1, asks), 3),
        "wall_s_per_run": round(statistics.mean(run.wall_s for run in runs), 2),
        "counts_mean": {
            name: round(statistics.mean(run.counts[name] for run in runs), 1) for name in runs[0].counts
        },
    }


def _pct(pct: float) -> str:
    return f"{pct:g}%"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--replay-dir", type=Path, default=None, help="directory of recorded spaces")
    parser.add_argument("--spaces", default="", help="comma-separated space names (default: all)")
    parser.add_argument("--seeds", type=int, default=5, help="seeds per strategy and space (default 5)")
    parser.add_argument("--budgets", default="1,2,5,10", help="percent of the valid space (default 1,2,5,10)")
    parser.add_argument("--strategies", default="tpe,random", help="comma-separated (default tpe,random)")
    parser.add_argument("--jobs", type=int, default=1, help="parallel processes (default 1)")
    parser.add_argument("--batch", type=int, default=1, help="candidates asked at once (parallel workers)")
    parser.add_argument("--tpe-options", default="{}", help="JSON overrides of TpeOptions")
    args = parser.parse_args(argv)
    args.budget_list = sorted(float(b) for b in args.budgets.split(","))
    args.strategy_list = [s for s in args.strategies.split(",") if s]
    unknown = [s for s in args.strategy_list if s not in STRATEGIES]
    if unknown or args.seeds < 1 or args.jobs < 1 or args.batch < 1:
        parser.error(f"bad --strategies {unknown}, or --seeds/--jobs/--batch below 1")
    args.options = json.loads(args.tpe_options)
    known = {f.name for f in fields(TpeOptions)}
    if not set(args.options) <= known:
        parser.error(f"--tpe-options: unknown keys {sorted(set(args.options) - known)}")
    return args


def make_tasks(args: argparse.Namespace, files: dict[str, Path]) -> list[Task]:
    """Every (space, strategy, seed) run, the costly spaces first so parallel jobs end together."""
    tasks = []
    for name, path in files.items():
        space = load_replay(path)
        max_trials = budget_trials(space, max(args.budget_list))
        for strategy in args.strategy_list:
            options = args.options if strategy == "tpe" else {}
            for seed in range(args.seeds):
                tasks.append(Task(name, str(path), strategy, seed, max_trials, args.batch, options))
    return sorted(tasks, key=lambda t: (t.strategy != "tpe", -t.max_trials))


def run_all(tasks: list[Task], jobs: int) -> list[Run]:
    """Run the tasks (in ``jobs`` processes when more than one), reporting progress on stderr."""
    runs: list[Run] = []
    if jobs == 1:
        results = map(run_task, tasks)
        for run in results:
            runs.append(_progress(run, len(runs) + 1, len(tasks)))
        return runs
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for run in pool.map(run_task, tasks):
            runs.append(_progress(run, len(runs) + 1, len(tasks)))
    return runs


def _progress(run: Run, done: int, total: int) -> Run:
    task = run.task
    best = run.history[-1] if run.history else math.inf
    print(
        f"[{done}/{total}] {task.space} {task.strategy} seed={task.seed}: {len(run.history)} measured, "
        f"best {best:.4g} ms, {run.wall_s:.1f} s",
        file=sys.stderr,
        flush=True,
    )
    return run


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    files = replay_spaces(args.replay_dir)
    if args.spaces:
        wanted = args.spaces.split(",")
        missing = [name for name in wanted if name not in files]
        if missing:
            print(f"--spaces: unknown {missing}; known: {sorted(files)}", file=sys.stderr)
            return 2
        files = {name: files[name] for name in wanted}
    started = time.perf_counter()
    runs = run_all(make_tasks(args, files), args.jobs)
    spaces = {
        name: summarize_space(load_replay(path), [r for r in runs if r.task.space == name], args.budget_list)
        for name, path in files.items()
    }
    document = {
        "benchmark": "search_replay",
        "seeds": args.seeds,
        "batch": args.batch,
        "tpe_options": asdict(TpeOptions(**args.options)),
        "goal": {"budget": _pct(GOAL_BUDGET_PCT), "median": GOAL_MEDIAN, "worst": GOAL_WORST},
        "spaces": spaces,
        "all_goals_met": all(
            s.get("goal_5pct_met", False) and all(s.get("tpe_better_than_random", {"": False}).values())
            for s in spaces.values()
        ),
        "wall_s": round(time.perf_counter() - started, 1),
    }
    json.dump(document, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
