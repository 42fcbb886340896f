"""What the service costs a tuning job (``service_overhead``, ``replay_worker_cost``), and how far
two workers agree (``worker_agreement``)."""

from __future__ import annotations

import statistics
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator

#: ``service_overhead``'s goal: the job through the service within this ratio of the job run locally.
SERVICE_OVER_LOCAL_GOAL = 1.10


def plot_service_overhead(document: dict[str, Any]) -> Figure:
    """Each local / service pair's wall times, and each pair's ratio against the goal."""
    pairs: list[dict[str, float]] = document["pairs"]
    local = np.array([pair["local_s"] for pair in pairs])
    service = np.array([pair["service_s"] for pair in pairs])
    ratios = service / local
    positions = np.arange(1, len(pairs) + 1)
    figure, (times, ratio) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": (3, 2)})
    width = 0.4
    times.bar(positions - width / 2, local, width, color="tab:blue", label="local tune()")
    times.bar(positions + width / 2, service, width, color="tab:orange", label="server + worker")
    times.set_xticks(positions)
    times.set_xlabel("pair (run in this order, local first)")
    times.set_ylabel("wall time of the job (s)")
    times.legend(fontsize=8)
    times.grid(True, axis="y", alpha=0.3)
    ratio.plot(positions, ratios, marker="o", linestyle="none", color="tab:orange", label="pair")
    median = statistics.median(ratios.tolist())
    ratio.axhline(median, color="tab:orange", linewidth=1, label=f"median {median:.2f}×")
    ratio.axhline(
        SERVICE_OVER_LOCAL_GOAL,
        color="tab:red",
        linestyle=":",
        label=f"goal ≤ {SERVICE_OVER_LOCAL_GOAL:.2f}×",
    )
    ratio.axhline(1.0, color="black", linewidth=0.8)
    ratio.set_xticks(positions)
    ratio.set_xlabel("pair")
    ratio.set_ylabel("service ÷ local wall time")
    ratio.legend(fontsize=8)
    ratio.grid(True, axis="y", alpha=0.3)
    shape = "×".join(str(v) for v in document["shape"].values())
    overhead = document["overhead_per_trial_ms"]["median"]
    figure.suptitle(
        f"One {document['kernel']} {shape} job of {document['trials']} trials, locally and through the "
        f"service ({document['batch']} configs per ask): {overhead:.1f} ms per trial added at the median",
        fontsize=10,
    )
    figure.tight_layout()
    return figure


def plot_replay_worker_cost(document: dict[str, Any]) -> Figure:
    """Per trial: wall time, the server's and the worker's CPU, and the worker's lookup path, in ms."""
    lookup = document["lookup"]
    rows = [("worker's lookup path, in process", lookup["us_per_trial_median"] / 1e3, "tab:green")]
    title = f"Replay trials ({lookup['kernel']})"
    if "service" in document:
        service = document["service"]
        rows = [
            ("wall time (1 ÷ trials/s)", 1e3 / service["trials_per_s"], "tab:grey"),
            ("server process CPU", service["server_cpu_ms_per_trial"], "tab:orange"),
            ("worker process CPU", service["worker_cpu_ms_per_trial"], "tab:blue"),
            *rows,
        ]
        workers = "one worker" if service["workers"] == 1 else f"{service['workers']} workers"
        title += (
            f": {service['trials_per_s']:g} trials/s with one server process and {workers}\n"
            f"{service['jobs']} jobs × {service['trials_per_job']} trials, {service['batch']} configs per ask"
        )
    figure, axis = plt.subplots(figsize=(9, 1.0 + 0.6 * len(rows)))
    positions = np.arange(len(rows))[::-1]
    values = [value for _, value, _ in rows]
    bars = axis.barh(positions, values, color=[colour for _, _, colour in rows])
    axis.bar_label(bars, [f"{value:.3g} ms" for value in values], padding=3, fontsize=8)
    axis.set_yticks(positions, [label for label, _, _ in rows], fontsize=9)
    axis.set_xlabel("ms per trial (CPU from /proc, 10 ms ticks)")
    axis.set_xlim(0, max(values) * 1.2)
    axis.grid(True, axis="x", alpha=0.3)
    axis.set_title(title, fontsize=10)
    figure.tight_layout()
    return figure


def plot_worker_agreement(document: dict[str, Any]) -> Figure:
    """Each pair's ratio (one worker's validation time over the other's search time of one config),
    by kernel, on a log axis, against the agreement ratio either way."""
    pairs: list[dict[str, Any]] = document["pairs"]
    limit = document["agreement_ratio"]
    kernels = sorted({pair["kernel"] for pair in pairs})
    figure, axis = plt.subplots(figsize=(9, 4.2))
    for index, kernel in enumerate(kernels):
        ratios = [pair["ratio"] for pair in pairs if pair["kernel"] == kernel]
        jitter = np.linspace(-0.15, 0.15, len(ratios)) if len(ratios) > 1 else np.zeros(1)
        axis.plot(index + jitter, ratios, marker="o", linestyle="none", alpha=0.7, label=kernel)
    for bound in (limit, 1 / limit):
        axis.axhline(bound, color="tab:red", linestyle=":")
    axis.axhline(1.0, color="black", linewidth=0.8)
    axis.set_yscale("log")
    ticks = [0.5, 0.67, 0.8, 1.0, 1.25, 1.5, 2.0]
    axis.set_yticks(ticks, [f"{tick:g}×" for tick in ticks])
    axis.yaxis.set_minor_locator(NullLocator())
    axis.set_xticks(range(len(kernels)), kernels)
    axis.set_ylabel("validation ÷ search median (two workers, one config)")
    axis.grid(True, axis="y", alpha=0.3)
    summary = document["summary"]
    axis.set_title(
        f"Two honest workers of one CPU: {summary.get('pairs', 0)} pairs, disagreement median "
        f"{summary.get('median', float('nan')):.2f}×, worst {summary.get('worst', float('nan')):.2f}×; "
        f"agreement ratio {limit:g}× (dotted)",
        fontsize=10,
    )
    figure.tight_layout()
    return figure
