"""The dashboard's pages on a big store: ``dashboard``."""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure


def plot_dashboard(document: dict[str, Any]) -> Figure:
    """Every page's server time, median and p95 ms, against the goal; pages missing it in red."""
    pages: dict[str, Any] = document["pages"]
    names = list(pages)
    positions = np.arange(len(names))[::-1]
    median = [pages[name]["median_ms"] for name in names]
    p95 = [pages[name]["p95_ms"] for name in names]
    figure, axis = plt.subplots(figsize=(10, 1.4 + 0.32 * len(names)))
    axis.barh(positions, p95, color="tab:blue", alpha=0.35, label="p95")
    bars = axis.barh(positions, median, color="tab:blue", label="median")
    axis.bar_label(bars, [f"{value:.1f}" for value in median], padding=3, fontsize=7)
    goal = document["goal_ms"]
    axis.axvline(goal, color="tab:red", linestyle=":", label=f"goal: ≤ {goal:g} ms")
    axis.set_yticks(positions, [name.replace("_", " ") for name in names], fontsize=8)
    for tick, name in zip(axis.get_yticklabels(), names, strict=True):
        if not pages[name]["meets_goal"]:
            tick.set_color("tab:red")
    axis.set_xlabel("server time per request (ms)")
    axis.set_xlim(0, max([goal, *p95]) * 1.1)
    axis.legend(fontsize=8, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=3, frameon=False)
    axis.grid(True, axis="x", alpha=0.3)
    store, rows = document["store"], document["store"]["rows"]
    figure.suptitle(
        f"Dashboard pages through the app's ASGI interface, {store['url']}: {rows['best_configs']:,} best "
        f"configs, {rows['trials']:,} trials\n{document['repeats']} interleaved rounds after warm-up "
        "(red: a page missing the goal)",
        fontsize=10,
    )
    figure.tight_layout()
    return figure
