"""Search on recorded spaces: ``search_replay`` and ``space_basins``."""

from __future__ import annotations

import math
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

STRATEGY_COLOURS = {"tpe": "tab:blue", "random": "tab:grey"}
STRATEGY_LABELS = {"tpe": "ours", "random": "random"}


def _budget_pct(label: str) -> float:
    """``"5%"`` -> 5.0 (the budgets' keys in ``search_replay``'s document)."""
    return float(label.rstrip("%"))


def plot_search_replay(document: dict[str, Any]) -> Figure:
    """Fraction of the optimum against the budget, one panel per space, median and worst seed."""
    spaces: dict[str, Any] = document["spaces"]
    columns = 3
    rows = math.ceil(len(spaces) / columns)
    figure, axes = plt.subplots(
        rows, columns, figsize=(4.0 * columns, 2.9 * rows), sharex=True, squeeze=False
    )
    for index, (name, space) in enumerate(sorted(spaces.items())):
        axis = axes[index // columns][index % columns]
        for strategy, summary in sorted(space["strategies"].items(), reverse=True):
            fractions: dict[str, Any] = summary["fraction"]
            budgets = [_budget_pct(label) for label in fractions]
            colour = STRATEGY_COLOURS.get(strategy, "tab:orange")
            label = STRATEGY_LABELS.get(strategy, strategy)
            medians = [f["median"] for f in fractions.values()]
            worst = [f["worst"] for f in fractions.values()]
            axis.plot(budgets, medians, marker="o", color=colour, label=f"{label}, median")
            axis.plot(budgets, worst, marker="v", linestyle="--", color=colour, label=f"{label}, worst")
        axis.axhline(0.97, color="tab:red", linewidth=0.8, linestyle=":")
        axis.set_xscale("log")
        axis.set_xticks(budgets, [f"{b:g}" for b in budgets])
        axis.set_ylim(0.4, 1.02)
        axis.set_title(f"{name.replace('_', ' ')} ({space['valid_configs']:,})", fontsize=9)
        axis.grid(True, alpha=0.3)
    for extra in range(len(spaces), rows * columns):
        axes[extra // columns][extra % columns].set_visible(False)
    for axis in axes[-1]:
        axis.set_xlabel("% of the valid space measured")
    for row in axes:
        row[0].set_ylabel("fraction of the optimum")
    handles, labels = axes[0][0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=4, fontsize=9)
    figure.suptitle(
        f"Search on recorded spaces: {document['seeds']} seeds per space (dotted: 0.97 of the optimum)"
    )
    figure.tight_layout(rect=(0, 0.05, 1, 0.97))
    return figure


def plot_space_basins(document: dict[str, Any]) -> Figure:
    """Share of each space climbing to within ``reach`` of the optimum, one-knob vs two-knob moves."""
    spaces: dict[str, Any] = document["spaces"]
    names = sorted(spaces)
    one = [spaces[n]["one_knob"]["share_climbing_within_reach"] for n in names]
    two = [spaces[n]["two_knobs"]["share_climbing_within_reach"] for n in names]
    positions = range(len(names))
    width = 0.4
    figure, axis = plt.subplots(figsize=(10, 4.2))
    axis.bar([p - width / 2 for p in positions], one, width, label="one-knob moves", color="tab:blue")
    axis.bar([p + width / 2 for p in positions], two, width, label="two-knob moves", color="tab:orange")
    axis.set_xticks(list(positions), [n.replace("_", "\n", 1).replace("_", " ") for n in names], fontsize=8)
    axis.set_ylim(0, 1.05)
    axis.set_ylabel(f"share of configs climbing within {document['reach']:g}")
    axis.set_title("Hill climbing on each recorded space: the share that reaches the optimum's basin")
    axis.legend()
    axis.grid(True, axis="y", alpha=0.3)
    figure.tight_layout()
    return figure
