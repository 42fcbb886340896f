"""The server under HTTP load: ``http_load`` (wrk, every endpoint) and ``http_lookup`` (httpx clients)."""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib import ticker
from matplotlib.figure import Figure

#: Plain numbers on log axes: 0.5, 10, 1,000 rather than powers of ten.
PLAIN = ticker.FuncFormatter(lambda value, _: f"{value:,g}")

#: ``http_load``'s single-scenario rows, in the order drawn, with their labels.
LOAD_SCENARIOS = {
    "trivial": "trivial async def endpoint",
    "lookups": "exact lookups",
    "exports": "bulk export, gzip",
    "revalidate": "export revalidated (304)",
}


def _ms(value: float) -> str:
    """Milliseconds to two or three significant digits: ``0.44``, ``9.8``, ``59``, ``1,560``."""
    return f"{value:.2g}" if value < 10 else f"{value:,.0f}"


def _load_rows(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """``(goal owner, label, figures)`` per drawn row: the scenarios, then the mixed load's endpoints.

    The goal owner is how ``http_load``'s goals name the row: ``lookups``, ``mixed worker_ask``.
    """
    scenarios = document["scenarios"]
    rows = []
    for name, label in LOAD_SCENARIOS.items():
        figures = scenarios[name]
        rows.append((name, f"{label} ({figures['connections']})", figures))
    for name, figures in scenarios["mixed"]["endpoints"].items():
        clients = figures.get("connections", figures.get("clients"))
        rows.append((f"mixed {name}", f"mixed: {name.replace('_', ' ')} ({clients})", figures))
    return rows


def _missed(document: dict[str, Any]) -> set[str]:
    """The goal owners (see :func:`_load_rows`) with a goal not met."""
    return {goal["goal"].split(":")[0].split(" (")[0] for goal in document["goals"] if not goal["pass"]}


def plot_http_load(document: dict[str, Any]) -> Figure:
    """Requests/s and p50 / p99 latency per scenario and per endpoint of the mixed load."""
    rows = _load_rows(document)
    missed = _missed(document)
    positions = np.arange(len(rows))[::-1]
    labels = [label for _, label, _ in rows]
    figure, (rate, latency) = plt.subplots(
        1, 2, figsize=(12, 1.2 + 0.42 * len(rows)), sharey=True, gridspec_kw={"width_ratios": (1, 1.3)}
    )
    throughput = [figures["requests_per_s"] for _, _, figures in rows]
    bars = rate.barh(positions, throughput, color="tab:blue")
    rate.bar_label(bars, [f"{value:,.0f}" for value in throughput], padding=3, fontsize=7)
    rate.set_xscale("log")
    rate.set_xlim(min(throughput) / 2, max(throughput) * 4)
    rate.set_xlabel("requests/s (log)")
    rate.set_yticks(positions, labels, fontsize=8)
    for tick, (owner, _, _) in zip(rate.get_yticklabels(), rows, strict=True):
        if owner in missed:
            tick.set_color("tab:red")
    p50 = [figures["p50_ms"] for _, _, figures in rows]
    p99 = [figures["p99_ms"] for _, _, figures in rows]
    tails = latency.barh(positions, p99, color="tab:orange", alpha=0.45, label="p99")
    latency.barh(positions, p50, color="tab:orange", label="p50")
    latency.bar_label(
        tails, [f"{_ms(a)} / {_ms(b)}" for a, b in zip(p50, p99, strict=True)], padding=3, fontsize=7
    )
    latency.set_xscale("log")
    latency.set_xlim(min(p50) / 2, max(p99) * 8)
    latency.set_xlabel("latency (ms, log): p50 / p99")
    latency.axvline(100, color="tab:red", linestyle=":", label="mixed load's goal: p99 ≤ 100 ms")
    latency.legend(fontsize=8, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=3, frameon=False)
    for axis in (rate, latency):
        axis.xaxis.set_major_formatter(PLAIN)
        axis.grid(True, axis="x", which="both", alpha=0.3)
    errors = sum(figures["errors"] for _, _, figures in rows)
    figure.suptitle(
        f"One tiletune server process on one core, {document['database']}, {document['configs']:,} best "
        f"configs; wrk on the other core, {document['duration_s']:g} s per scenario; "
        f"{errors} errors\n(connections or clients in brackets; red: a goal of that row missed)",
        fontsize=10,
    )
    figure.tight_layout()
    return figure


def plot_http_lookup(document: dict[str, Any]) -> Figure:
    """Requests/s and p50 / p99 latency against the number of concurrent clients."""
    levels: list[dict[str, Any]] = document["levels"]
    clients = [level["clients"] for level in levels]
    figure, (rate, latency) = plt.subplots(1, 2, figsize=(10, 4))
    rate.plot(clients, [level["requests_per_s"] for level in levels], marker="o", color="tab:blue")
    rate.set_ylabel("requests/s")
    rate.set_ylim(bottom=0)
    latency.plot(clients, [level["p50_ms"] for level in levels], marker="o", color="tab:orange", label="p50")
    latency.plot(
        clients,
        [level["p99_ms"] for level in levels],
        marker="v",
        linestyle="--",
        color="tab:orange",
        label="p99",
    )
    latency.set_yscale("log")
    latency.yaxis.set_major_formatter(PLAIN)
    latency.set_ylabel("latency (ms, log)")
    latency.legend(fontsize=8)
    for axis in (rate, latency):
        axis.set_xscale("log", base=2)
        axis.set_xticks(clients, [str(c) for c in clients])
        axis.set_xlabel("concurrent clients (one keep-alive connection each)")
        axis.grid(True, which="both", alpha=0.3)
    errors = sum(level["errors"] for level in levels)
    figure.suptitle(
        f"Single-key lookups over HTTP (httpx): one server process, {document['database']}, "
        f"{document['configs']:,} best configs, {document['cpu_count']} cores shared; {errors} errors",
        fontsize=10,
    )
    figure.tight_layout()
    return figure


def plot_store_size(document: dict[str, Any]) -> Figure:
    """Per store size: lookups' requests/s and p50 / p99 / max latency (medians over rounds), and the
    seconds of each imported bundle in order."""
    sizes = sorted(document["sizes"], key=int)
    lookups = [document["sizes"][size]["lookups"] for size in sizes]
    positions = np.arange(len(sizes))
    labels = [f"{int(size):,}" for size in sizes]
    figure, (rate, latency, imports) = plt.subplots(1, 3, figsize=(14, 4.2))
    bars = rate.bar(positions, [figures["requests_per_s"] for figures in lookups], color="tab:blue")
    rate.bar_label(bars, [f"{figures['requests_per_s']:,.0f}" for figures in lookups], fontsize=8)
    rate.set_ylabel("exact lookups/s (median of rounds)")
    for name, marker in (("p50_ms", "o"), ("p99_ms", "v"), ("max_ms", "x")):
        latency.plot(positions, [figures[name] for figures in lookups], marker=marker, label=name[:-3])
    smallest_p99 = lookups[0]["p99_ms"]
    latency.axhline(smallest_p99 * 1.2, color="tab:red", linestyle=":", label="1.2 x the smallest's p99")
    latency.set_yscale("log")
    latency.yaxis.set_major_formatter(PLAIN)
    latency.yaxis.set_minor_formatter(PLAIN)
    latency.set_ylabel("latency (ms, log)")
    latency.legend(fontsize=8)
    for size in sizes:
        seconds = document["sizes"][size]["import_s"]
        imports.plot(
            np.arange(1, len(seconds) + 1) * document["chunk"], seconds, marker=".", label=f"{int(size):,}"
        )
    imports.set_xscale("log")
    imports.xaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:,.0f}"))
    imports.set_xlabel("configs stored after the bundle (log)")
    imports.set_ylabel(f"seconds per bundle of {document['chunk']:,}")
    imports.set_ylim(bottom=0)
    imports.legend(fontsize=8, title="store size")
    for axis in (rate, latency):
        axis.set_xticks(positions, labels)
        axis.set_xlabel("best configs stored")
    for axis in (rate, latency, imports):
        axis.grid(True, alpha=0.3)
    missed = [goal["goal"] for goal in document["goals"] if not goal["pass"]]
    figure.suptitle(
        f"Lookups and imports as the store grows: one server process per size on one core, "
        f"{document['database']}; wrk, {document['connections']} connections, {document['rounds']} "
        f"interleaved rounds of {document['duration_s']:g} s\n"
        + (f"goals missed: {'; '.join(missed)}" if missed else "every goal met"),
        fontsize=10,
    )
    figure.tight_layout()
    return figure
