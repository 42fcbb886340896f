"""The client on the launch path: ``lookup_latency``."""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

#: ``lookup_latency``'s goal for a hit: the median call within this many ns.
HIT_GOAL_NS = 1000


def plot_lookup_latency(document: dict[str, Any]) -> Figure:
    """ns per call: a hit against a bare dict lookup (p50, p99), a launch with and without the client."""
    hit, launches = document["hit"], document["launches"]
    rows = [
        ("dict lookup, tuple key built inline", hit["bare_dict"]["p50_ns"], hit["bare_dict"]["p99_ns"]),
        ('client hit: get("add", {"n": n}, "float32")', hit["client"]["p50_ns"], hit["client"]["p99_ns"]),
        ("torch.add launch (16 floats), constant config", launches["without_ns_per_launch"], None),
        ("the same launch, its config from the client", launches["with_client_ns_per_launch"], None),
    ]
    positions = np.arange(len(rows))[::-1]
    figure, axis = plt.subplots(figsize=(10, 3.8))
    median = [value for _, value, _ in rows]
    p99 = [value if value is not None else np.nan for _, _, value in rows]
    axis.barh(positions, p99, color="tab:blue", alpha=0.35, label="p99 over batches of 1,000 calls")
    axis.barh(positions, median, color="tab:blue", label="median (launches: of 10 blocks)")
    for position, (_, middle, tail) in zip(positions, rows, strict=True):
        text = f"{middle:,.0f} / {tail:,.0f} ns" if tail is not None else f"{middle:,.0f} ns"
        axis.annotate(
            text, (max(middle, tail or 0), position), xytext=(4, 0), textcoords="offset points", va="center"
        )
    axis.axvline(HIT_GOAL_NS, color="tab:red", linestyle=":", label="goal: a hit's median ≤ 1 µs")
    axis.set_yticks(positions, [label for label, _, _ in rows], fontsize=9)
    axis.set_xlim(0, max(median + [t for _, _, t in rows if t is not None]) * 1.25)
    axis.set_xlabel("ns per call (median / p99)")
    axis.legend(fontsize=8, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=3, frameon=False)
    axis.grid(True, axis="x", alpha=0.3)
    prefetch, down = document["prefetch"], document["down_server"]
    figure.suptitle(
        f"The client on the launch path: a hit is {hit['ratio_p50']:.1f}× a bare dict lookup, a launch "
        f"+{launches['overhead_ns_per_launch']:,.0f} ns\nprefetch of {prefetch['configs']:,} configs "
        f"{prefetch['median_s']:.2f} s; server down: first call {down['first_call_s'] * 1e3:.0f} ms, then "
        f"{down['added_ms']:+.2f} ms over {down['launches']:,} launches",
        fontsize=10,
    )
    figure.tight_layout()
    return figure
