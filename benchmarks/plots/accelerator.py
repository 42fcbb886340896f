"""Trial isolation, the C++ client and compile-time tiles: ``isolation_overhead``, ``cpp_lookup``,
``compile_time_tiles``."""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

#: ``isolation_overhead``'s cases, in the order drawn, and their titles.
ISOLATION_CASES = {"tiny": "tiny trial (n = {n:,})", "10ms": "≈10 ms trial (n = {n:,})"}
#: ``isolation_overhead``'s goal: a 10 ms trial's paired overhead within this share of it.
ISOLATION_GOAL = 0.10
#: ``cpp_lookup``'s kinds, in the order drawn (top first), and their labels.
CPP_KINDS = {
    "exact_same_key": "hit, one key each batch",
    "exact": "hit, keys in turn (cold)",
    "exact_via_client": "hit, through a Client",
    "nearest": "nearest (first dim + 1)",
    "default": "default (kernel not in the bundle)",
}


def _whiskers(rows: list[dict[str, Any]], unit: str) -> tuple[np.ndarray, np.ndarray]:
    """Medians and ``[below, above]`` whisker lengths (p10 to p90) of summaries in ``unit`` (ms, ns)."""
    median = np.array([row[f"median_{unit}"] for row in rows])
    low = np.array([row[f"p10_{unit}"] for row in rows])
    high = np.array([row[f"p90_{unit}"] for row in rows])
    return median, np.vstack([median - low, high - median])


def _isolation_case(axis: Axes, name: str, case: dict[str, Any]) -> None:
    """One case's two bars (median ms, p10–p90 whiskers) and its overhead, annotated."""
    median, error = _whiskers([case["in_process"], case["isolated"]], "ms")
    axis.bar([0, 1], median, yerr=error, capsize=4, color=["tab:grey", "tab:blue"], width=0.6)
    axis.set_xticks([0, 1], ["in process", "isolated\n(warm trial process)"], fontsize=9)
    for position, value in enumerate(median):
        axis.annotate(f"{value:.3g} ms", (position, value), xytext=(6, 2), textcoords="offset points")
    ratio = case["overhead_ratio"]
    goal = f" (goal ≤ {ISOLATION_GOAL:.0%})" if name == "10ms" else ""
    axis.set_title(
        f"{ISOLATION_CASES.get(name, name).format(n=case['n'])}, {case['trials']} trials\n"
        f"overhead {case['overhead']['median_ms']:+.3g} ms = {ratio:+.1%}{goal}",
        fontsize=9,
        color="tab:red" if name == "10ms" and ratio > ISOLATION_GOAL else "black",
    )
    axis.set_ylim(0, float(np.max(median + error[1])) * 1.25)
    axis.set_ylabel("ms per trial (median, p10–p90)")
    axis.grid(True, axis="y", alpha=0.3)


def plot_isolation_overhead(document: dict[str, Any]) -> Figure:
    """Per case, the in-process and the isolated trial's median (p10–p90 whiskers), the overhead in %."""
    names = [name for name in ISOLATION_CASES if name in document]
    figure, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names) + 1, 4.4), squeeze=False)
    for axis, name in zip(axes[0], names, strict=True):
        _isolation_case(axis, name, document[name])
    trip = document["round_trip"]
    settings = document["settings"]
    figure.suptitle(
        f"What isolating a trial costs: {document['kernel']} on the CPU, {settings['warmup_runs']} warm-up "
        f"+ {settings['samples']} samples per evaluate\nround trip of a refused check: "
        f"{trip['isolated']['median_us']:.0f} µs isolated, {trip['in_process']['median_us']:.1f} µs in "
        f"process; trial process start {document['start_s']:.2f} s",
        fontsize=10,
    )
    figure.tight_layout()
    return figure


def plot_cpp_lookup(document: dict[str, Any]) -> Figure:
    """ns per lookup of each kind: median bar, p10–p90 whiskers, p99 tick; the goal for a hit as a line."""
    kinds = [kind for kind in CPP_KINDS if kind in document]
    rows = [document[kind] for kind in kinds]
    median, error = _whiskers(rows, "ns")
    p99 = np.array([row["p99_ns"] for row in rows])
    positions = np.arange(len(kinds))[::-1]
    figure, axis = plt.subplots(figsize=(10, 3.8))
    axis.barh(positions, median, xerr=error, capsize=4, color="tab:blue", label="median, p10–p90")
    axis.plot(p99, positions, "|", color="black", markersize=14, label="p99")
    for position, middle, tail, row in zip(positions, median, p99, rows, strict=True):
        axis.annotate(
            f"{middle:,.1f} ns (p99 {tail:,.0f}); {row['answered_as_expected']:.0%} as expected",
            (max(float(middle), float(tail)), position),
            xytext=(6, 0),
            textcoords="offset points",
            va="center",
            fontsize=8,
        )
    goal = document.get("goal_hit_ns", 100)
    axis.axvline(goal, color="tab:red", linestyle=":", label=f"goal: a hit's median ≤ {goal} ns")
    axis.set_yticks(positions, [CPP_KINDS[kind] for kind in kinds], fontsize=9)
    axis.set_xscale("log")  # a nearest answer's scan may be 100× a hit: both stay readable
    axis.set_xlim(min(float(np.min(median)), goal) / 3, max(float(np.max(p99)), goal) * 30)
    axis.set_xlabel(
        f"ns per lookup, log axis (batches of {document['batch']:,}, {document['rounds']} batches)"
    )
    axis.legend(fontsize=8, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=3, frameon=False)
    axis.grid(True, axis="x", alpha=0.3)
    figure.suptitle(
        f"The C++ client's lookup: {document['entries']:,} tuned entries, {document['keys']:,} keys in turn; "
        f"bundle loaded in {document['load_ms']:.1f} ms",
        fontsize=10,
    )
    figure.tight_layout()
    return figure


def _tiles_label(tiles: dict[str, int], default: bool) -> str:
    return "×".join(str(value) for value in tiles.values()) + ("\n(default)" if default else "")


def _tiles_case(axis: Axes, case: dict[str, Any]) -> None:
    """One shape: per config, the compile-time and the run-time build's median (p10–p90), torch's median."""
    configs: list[dict[str, Any]] = case["configs"]
    positions = np.arange(len(configs))
    for offset, (key, label, colour) in zip(
        (-0.2, 0.2),
        (("compile_time", "tiles compiled in", "tab:blue"), ("run_time", "tiles as arguments", "tab:grey")),
        strict=True,
    ):
        median, error = _whiskers([config[key] for config in configs], "ms")
        axis.bar(positions + offset, median, 0.4, yerr=error, capsize=2, color=colour, label=label)
    torch_ms = float(np.median([config["torch_matmul"]["median_ms"] for config in configs]))
    axis.axhline(torch_ms, color="tab:orange", linestyle=":", label="torch.matmul (median)")
    for position, config in zip(positions, configs, strict=True):
        top = max(config["compile_time"]["p90_ms"], config["run_time"]["p90_ms"])
        axis.annotate(
            f"{config['static_speedup']:.2f}×",
            (position, top),
            xytext=(0, 2),
            textcoords="offset points",
            ha="center",
            fontsize=7,
        )
    labels = [_tiles_label(c["tiles"], index == len(configs) - 1) for index, c in enumerate(configs)]
    axis.set_xticks(positions, labels, fontsize=7)
    shape = case["shape"]
    axis.set_title(
        f"{shape['m']}×{shape['n']}×{shape['k']}: "
        f"best run-time ÷ best compile-time {case['best_speedup']:.2f}×",
        fontsize=9,
    )
    axis.set_ylabel("ms (median, p10–p90)")
    axis.grid(True, axis="y", alpha=0.3)


def _build_ahead(axis: Axes, runs: dict[str, dict[str, Any]]) -> None:
    """Each run's job wall time split into measuring, waiting for builds and the rest; ``busy`` annotated."""
    names = list(runs)
    positions = np.arange(len(names))[::-1]
    left = np.zeros(len(names))
    for key, label, colour in (
        ("measuring_s", "measuring", "tab:green"),
        ("build_wait_s", "waiting for a build", "tab:red"),
        ("other_s", "other (start, default, asks, tells)", "tab:grey"),
    ):
        widths = np.array([max(runs[name][key], 0.0) for name in names])
        axis.barh(positions, widths, left=left, color=colour, label=label)
        left += widths
    for position, name, right in zip(positions, names, left, strict=True):
        run = runs[name]
        axis.annotate(
            f"busy {run['busy']:.0%} ({run.get('busy_while_measuring', run['busy']):.0%} while measuring); "
            f"{run['builds']} builds ({run['build_s']:.1f} s), "
            f"{run['ready_when_measured']} ready when measured; load {run['load_average_1m']:.1f}",
            (right, position),
            xytext=(6, 0),
            textcoords="offset points",
            va="center",
            fontsize=8,
        )
    labels = [f"{name.replace('_', ' ')}\n({runs[name]['build_workers']} build workers)" for name in names]
    axis.set_yticks(positions, labels, fontsize=9)
    axis.set_xlim(0, float(np.max(left)) * 1.9)
    axis.set_xlabel("seconds of the job's wall time")
    axis.set_title(
        f"Build ahead: a {runs[names[0]]['trials']}-config compiled_matmul sweep", fontsize=9, loc="left"
    )
    axis.legend(fontsize=8, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=3, frameon=False)
    axis.grid(True, axis="x", alpha=0.3)


def plot_compile_time_tiles(document: dict[str, Any]) -> Figure:
    """Per shape and config, compile-time against run-time tiles; the build-ahead runs if present."""
    cases: list[dict[str, Any]] = document["tiles"]
    ahead = document.get("build_ahead")
    rows = 2 if ahead else 1
    figure = plt.figure(figsize=(max(10.0, 4.2 * len(cases)), 4.6 + 3.0 * (rows - 1)))
    grid = figure.add_gridspec(rows, len(cases), height_ratios=[3, 2][:rows])
    for column, case in enumerate(cases):
        _tiles_case(figure.add_subplot(grid[0, column]), case)
    figure.axes[0].legend(fontsize=8, loc="upper left")
    if ahead:
        _build_ahead(figure.add_subplot(grid[1, :]), ahead)
    figure.suptitle(
        f"Compile-time tiles: compiled_matmul fp32, {document['threads']} thread, the same source built "
        "with the tiles as template parameters and as run-time arguments\n"
        "(labels: tile_m×tile_n×tile_k; above each pair: run-time median ÷ compile-time median)",
        fontsize=10,
    )
    figure.tight_layout()
    return figure
