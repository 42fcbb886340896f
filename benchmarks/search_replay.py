"""Search quality on recorded tuning spaces: how close to the optimum, after how much of the space.

For each recorded space (see ``tiletune.tuner.measure.replay``) and each strategy, runs
the search with several seeds against the replay device, each up to the largest
budget, and reports after each budget (a percentage of the valid space in unique
valid measurements, failures included): the fraction of the optimum reached
(optimum time / best time found), median and worst seed, and how many seeds
reach ``REACH`` (0.97); and, per run, the area under the best-so-far curve with
the budget on a log axis from the smallest to the largest budget
(``tiletune.tuner.search.quality.log_auc``: one figure per run); and the budget each seed
needed to first reach ``REACH`` (``to_reach``, % of the valid space; ``null`` when it
did not within the largest budget). ``tpe`` is compared
with ``random`` at the median and at the worst seed of every budget. Also
reports the cost per ask (mean, and over the last 10 % of asks) and wall time.

Goals (issue 15): at 5 % every space's worst seed >= 0.97 and median >= 0.995;
at 2 % worst >= 0.90; ``tpe`` better than ``random`` at the median and the worst
seed at every budget.

``--lodo CANDIDATES`` (a JSON object: label -> ``TpeOptions`` overrides) runs
every candidate on every space and judges by leave-one-device-out: for each
device, the candidate with the best mean score (``lodo_score``: the worst seed's
AUC, the median's and the share of seeds at ``REACH`` by the largest budget) over the
spaces of the *other* devices is chosen, and that device's spaces are reported with
it. ``--first-seed`` runs other seeds than the judged ones (0 ..), so settings can be
chosen on seeds that are not reported as well. ``--warm-start K`` seeds each ``tpe`` search
with the ``K`` best configs of the same kernel recorded on other devices (every
recorded space of the directory, not only those run; ``random`` stays plain).

Prints one JSON document on stdout, progress on stderr::

    python benchmarks/search_replay.py [--spaces gemm_RTX_3090,...] [--seeds 5] [--first-seed 0]
        [--budgets 1,2,5,10] [--strategies tpe,random] [--jobs 2] [--batch 1]
        [--replay-dir DIR] [--tpe-options '{"local_share": 0.5}']
        [--lodo '{"a": {}, "b": {"random_share": 0.1}}'] [--warm-start K]
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
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import optuna

from tiletune.kernels.replay.recorded import replay_spaces
from tiletune.tuner.measure.replay import ReplaySpace, load_replay
from tiletune.tuner.search.quality import (
    budget_needed,
    budget_trials,
    choose_leave_one_device_out,
    device_of,
    fraction_at,
    log_auc,
    trials_to_reach,
)
from tiletune.tuner.search.search import STRATEGIES, Config, Search, TpeOptions
from tiletune.tuner.search.warm_start import interleave_seeds

REACH = 0.97
#: (budget %, statistic, at least): the issue's goals for ``tpe``.
GOALS = ((5.0, "worst", 0.97), (5.0, "median", 0.995), (2.0, "worst", 0.90))


@dataclass(frozen=True)
class Task:
    """One search run: a space, a strategy (and candidate label) and a seed, up to ``max_trials``."""

    space: str
    path: str
    strategy: str
    label: str
    seed: int
    max_trials: int
    batch: int
    options: dict[str, Any]
    warm: tuple[tuple[tuple[str, int], ...], ...] = ()


@dataclass(frozen=True)
class Run:
    """What one run found: best time after each measurement and what asking cost."""

    task: Task
    history: list[float]
    ask_s: list[float]
    tell_s: float
    wall_s: float
    counts: dict[str, int]


def run_task(task: Task) -> Run:
    """Search one recorded space with one strategy and seed; the replay device measures."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = load_replay(task.path)
    started = time.perf_counter()
    search = Search(
        space.search_space(seeds=[dict(config) for config in task.warm]),
        strategy=task.strategy,
        seed=task.seed,
        max_trials=task.max_trials,
        options=TpeOptions(**task.options),
    )
    ask_s: list[float] = []
    tell_s = 0.0
    while not search.done:
        before = time.perf_counter()
        candidates = search.ask(task.batch)
        ask_s.append(time.perf_counter() - before)
        if not candidates:
            break
        before = time.perf_counter()
        for candidate in candidates:
            outcome = space.measure(candidate.config)
            search.tell(candidate.trial_id, outcome.time_ms, outcome.error)
        tell_s += time.perf_counter() - before
    wall_s = time.perf_counter() - started
    return Run(task, search.history, ask_s, tell_s, wall_s, search.counts.as_dict())


def warm_configs(space: ReplaySpace, others: Sequence[ReplaySpace], k: int) -> list[Config]:
    """Seeds from the ``k`` best configs of the same kernel on each other device, interleaved."""
    best_by_device = {}
    for other in others:
        if other.name == space.name or other.kernel_name != space.kernel_name:
            continue
        numeric = sorted((t, key) for key, t in other.entries.items() if not isinstance(t, str))
        best_by_device[other.name] = [dict(zip(other.knobs, key, strict=True)) for _, key in numeric[:k]]
    return interleave_seeds(best_by_device, k)


def summarize_strategy(space: ReplaySpace, runs: list[Run], budgets: Sequence[float]) -> dict[str, Any]:
    """Per budget: median, worst and per-seed fraction, seeds reaching ``REACH``; AUC; costs."""
    fraction: dict[str, dict[str, Any]] = {}
    for pct in budgets:
        values = [
            fraction_at(run.history, budget_trials(space.valid_count, pct), space.optimum_ms) for run in runs
        ]
        fraction[_pct(pct)] = {
            "median": round(statistics.median(values), 4),
            "worst": round(min(values), 4),
            "reached": sum(value >= REACH for value in values),
            "per_seed": [round(value, 4) for value in values],
        }
    first, last = (budget_trials(space.valid_count, pct) for pct in (min(budgets), max(budgets)))
    aucs = [log_auc(run.history, space.optimum_ms, first, last) for run in runs]
    needed = [trials_to_reach(run.history, space.optimum_ms, REACH) for run in runs]
    asks = [s for run in runs for s in run.ask_s]
    tail = [s for run in runs for s in run.ask_s[len(run.ask_s) * 9 // 10 :]]
    return {
        "seeds": [run.task.seed for run in runs],
        "fraction": fraction,
        "auc": {
            "median": round(statistics.median(aucs), 4),
            "worst": round(min(aucs), 4),
            "per_seed": [round(a, 4) for a in aucs],
        },
        "to_reach": budget_needed(needed, space.valid_count),
        "ask_ms_mean": round(1000 * statistics.mean(asks), 3),
        "ask_ms_last_tenth": round(1000 * statistics.mean(tail), 3),
        "wall_s_per_run": round(statistics.mean(run.wall_s for run in runs), 2),
        "counts_mean": {
            name: round(statistics.mean(run.counts[name] for run in runs), 1) for name in runs[0].counts
        },
    }


def versus_random(ours: dict[str, Any], random: dict[str, Any]) -> dict[str, Any]:
    """Per budget: ours and random's median and worst, and whether ours is better at each."""
    table = {}
    for budget, mine in ours["fraction"].items():
        theirs = random["fraction"][budget]
        table[budget] = {
            "ours": [mine["median"], mine["worst"]],
            "random": [theirs["median"], theirs["worst"]],
            "median_better": mine["median"] > theirs["median"],
            "worst_better": mine["worst"] > theirs["worst"],
        }
    return table


def goals_met(ours: dict[str, Any], random: dict[str, Any] | None) -> dict[str, bool]:
    """Each goal of the issue for one space (``vs_random`` only when random ran)."""
    met = {}
    for pct, statistic, least in GOALS:
        if _pct(pct) in ours["fraction"]:
            met[f"{statistic}@{_pct(pct)}>={least}"] = ours["fraction"][_pct(pct)][statistic] >= least
    if random is not None:
        met["beats_random"] = all(
            row["median_better"] and row["worst_better"] for row in versus_random(ours, random).values()
        )
    return met


def summarize_space(
    space: ReplaySpace, runs: list[Run], budgets: Sequence[float], label: str | None = None
) -> dict[str, Any]:
    """One space: per strategy the summary, ``tpe`` against ``random``, and the goals."""
    by_strategy: dict[str, list[Run]] = {}
    for run in runs:
        if run.task.strategy == "tpe" and label is not None and run.task.label != label:
            continue
        by_strategy.setdefault(run.task.strategy, []).append(run)
    strategies = {
        strategy: summarize_strategy(space, sorted(group, key=lambda r: r.task.seed), budgets)
        for strategy, group in sorted(by_strategy.items())
    }
    summary: dict[str, Any] = {
        "kernel": space.kernel_name,
        "device": device_of(space.name),
        "valid_configs": space.valid_count,
        "optimum_ms": space.optimum_ms,
        "budgets": {_pct(pct): budget_trials(space.valid_count, pct) for pct in budgets},
        "strategies": strategies,
    }
    if "tpe" in strategies:
        random = strategies.get("random")
        if random is not None:
            summary["vs_random"] = versus_random(strategies["tpe"], random)
        summary["goals"] = goals_met(strategies["tpe"], random)
    return summary


def lodo_score(summary: dict[str, Any]) -> float:
    """What leave-one-device-out maximises on the training spaces (higher is better).

    The mean of three: the worst seed's AUC, the median AUC, and the share of seeds at
    ``REACH`` by the largest budget (the tail the goals are about: a needle found late
    barely moves an AUC whose first budget weighs as much as its last).
    """
    auc = summary["auc"]
    last = list(summary["fraction"].values())[-1]
    reached = int(last["reached"]) / len(last["per_seed"])
    return (float(auc["worst"]) + float(auc["median"]) + reached) / 3.0


def _brief(summary: dict[str, Any]) -> dict[str, Any]:
    """``tpe``'s median, worst and seeds reaching ``REACH`` per budget; its AUC and ``to_reach``."""
    ours = summary["strategies"]["tpe"]
    brief: dict[str, Any] = {b: [f["median"], f["worst"], f["reached"]] for b, f in ours["fraction"].items()}
    auc, needed = ours["auc"], ours["to_reach"]
    return {**brief, "auc": [auc["median"], auc["worst"]], "to_reach": [needed["median"], needed["worst"]]}


def _pct(pct: float) -> str:
    return f"{pct:g}%"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--replay-dir", type=Path, default=None, help="directory of recorded spaces")
    parser.add_argument("--spaces", default="", help="comma-separated space names (default: all)")
    parser.add_argument("--seeds", type=int, default=5, help="seeds per strategy and space (default 5)")
    parser.add_argument(
        "--first-seed", type=int, default=0, help="seeds run are FIRST .. FIRST+SEEDS-1 (default 0)"
    )
    parser.add_argument("--budgets", default="1,2,5,10", help="percent of the valid space (default 1,2,5,10)")
    parser.add_argument("--strategies", default="tpe,random", help="comma-separated (default tpe,random)")
    parser.add_argument("--jobs", type=int, default=1, help="parallel processes (default 1)")
    parser.add_argument("--batch", type=int, default=1, help="candidates asked at once (parallel workers)")
    parser.add_argument("--tpe-options", default="{}", help="JSON overrides of TpeOptions")
    parser.add_argument("--lodo", default="", help="JSON object label -> TpeOptions overrides: judge by LODO")
    parser.add_argument("--warm-start", type=int, default=0, help="seed with K best configs of other devices")
    args = parser.parse_args(argv)
    args.budget_list = sorted(float(b) for b in args.budgets.split(","))
    args.strategy_list = [s for s in args.strategies.split(",") if s]
    unknown = [s for s in args.strategy_list if s not in STRATEGIES]
    if unknown or min(args.seeds, args.jobs, args.batch) < 1 or min(args.warm_start, args.first_seed) < 0:
        parser.error(
            f"bad --strategies {unknown}, or --seeds/--jobs/--batch below 1, "
            "or --warm-start/--first-seed below 0"
        )
    args.candidates = json.loads(args.lodo) if args.lodo else {"tpe": json.loads(args.tpe_options)}
    known = {f.name for f in fields(TpeOptions)}
    for label, options in args.candidates.items():
        if not set(options) <= known:
            parser.error(f"options of {label!r}: unknown keys {sorted(set(options) - known)}")
        TpeOptions(**options)
    return args


def make_tasks(args: argparse.Namespace, files: dict[str, Path], every: dict[str, Path]) -> list[Task]:
    """Every (space, strategy, candidate, seed) run, the costly ones first so parallel jobs end together."""
    recorded = [load_replay(path) for path in every.values()] if args.warm_start else []
    tasks = []
    for space in (load_replay(path) for path in files.values()):
        max_trials = budget_trials(space.valid_count, max(args.budget_list))
        warm = tuple(tuple(c.items()) for c in warm_configs(space, recorded, args.warm_start))
        for strategy in args.strategy_list:
            seeds = warm if strategy == "tpe" else ()  # random stays plain random search
            labels = args.candidates if strategy == "tpe" else {strategy: {}}
            for label, options in labels.items():
                for seed in range(args.first_seed, args.first_seed + args.seeds):
                    path = str(space.path)
                    tasks.append(
                        Task(space.name, path, strategy, label, seed, max_trials, args.batch, options, seeds)
                    )
    return sorted(tasks, key=lambda t: (t.strategy != "tpe", -t.max_trials))


def run_all(tasks: list[Task], jobs: int) -> list[Run]:
    """Run the tasks (in ``jobs`` processes when more than one), reporting progress on stderr."""
    runs: list[Run] = []
    if jobs == 1:
        for run in map(run_task, tasks):
            runs.append(_progress(run, len(runs) + 1, len(tasks)))
        return runs
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for run in pool.map(run_task, tasks):
            runs.append(_progress(run, len(runs) + 1, len(tasks)))
    return runs


def _progress(run: Run, done: int, total: int) -> Run:
    task = run.task
    best = run.history[-1] if run.history else float("inf")
    print(
        f"[{done}/{total}] {task.space} {task.label} seed={task.seed}: {len(run.history)} measured, "
        f"best {best:.4g} ms, {run.wall_s:.1f} s",
        file=sys.stderr,
        flush=True,
    )
    return run


def leave_one_device_out(args: argparse.Namespace, files: dict[str, Path], runs: list[Run]) -> dict[str, Any]:
    """Every candidate's summary per space, the choice per held-out device, and its spaces' figures."""
    per_label = {
        label: {
            name: summarize_space(
                load_replay(path), [r for r in runs if r.task.space == name], args.budget_list, label
            )
            for name, path in files.items()
        }
        for label in args.candidates
    }
    scores = {
        label: {name: lodo_score(s["strategies"]["tpe"]) for name, s in spaces.items()}
        for label, spaces in per_label.items()
    }
    chosen = choose_leave_one_device_out(scores)
    held_out = {name: per_label[chosen[device_of(name)]][name] for name in files}
    return {
        "candidates": args.candidates,
        "in_sample": {
            label: {n: _brief(s) for n, s in spaces.items()} for label, spaces in per_label.items()
        },
        "scores": {label: {n: round(v, 4) for n, v in s.items()} for label, s in scores.items()},
        "chosen": chosen,
        "spaces": held_out,
        "all_goals_met": all(all(s["goals"].values()) for s in held_out.values()),
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    files = every = replay_spaces(args.replay_dir)
    if args.spaces:
        wanted = args.spaces.split(",")
        missing = [name for name in wanted if name not in files]
        if missing:
            print(f"--spaces: unknown {missing}; known: {sorted(files)}", file=sys.stderr)
            return 2
        files = {name: files[name] for name in wanted}
    started = time.perf_counter()
    runs = run_all(make_tasks(args, files, every), args.jobs)
    document: dict[str, Any] = {
        "benchmark": "search_replay",
        "seeds": args.seeds,
        "batch": args.batch,
        "warm_start": args.warm_start,
        "goals": [{"budget": _pct(p), "statistic": s, "at_least": v} for p, s, v in GOALS],
    }
    if args.lodo:
        document["leave_one_device_out"] = leave_one_device_out(args, files, runs)
    else:
        spaces = {
            name: summarize_space(
                load_replay(path), [r for r in runs if r.task.space == name], args.budget_list
            )
            for name, path in files.items()
        }
        document["tpe_options"] = asdict(TpeOptions(**args.candidates["tpe"]))
        document["spaces"] = spaces
        document["all_goals_met"] = all(all(s.get("goals", {"": False}).values()) for s in spaces.values())
    document["wall_s"] = round(time.perf_counter() - started, 1)
    json.dump(document, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
