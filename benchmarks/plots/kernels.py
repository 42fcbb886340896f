"""Tuned kernels against the hand-written rule and the vendor's op: ``tuning_quality``, ``gpu_check``."""

from __future__ import annotations

import math
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib import ticker
from matplotlib.axes import Axes
from matplotlib.figure import Figure

#: Flags of a key read as words after its sizes (value -> word; a value not listed: nothing).
FLAG_WORDS = {
    "causal": {"1": "causal", "2": "causal bottom-right"},
    "mask": {"1": "masked"},
    "a_transposed": {"1": "A^T"},
    "b_transposed": {"1": "B^T"},
}


def shape_label(shape_key: str) -> str:
    """A canonical shape key, short: ``m=512,n=512,k=512`` -> ``512×512×512``.

    Powers of two from 2^16 up read as ``2^22``; flags read as words (:data:`FLAG_WORDS`: ``causal=1``
    reads ``causal``, ``b_transposed=1`` ``B^T``; 0 is left out), and ``kv_heads`` only where it
    differs from ``heads`` (``kv 2``), so an attention key reads ``1×4×256×256×64 causal``.
    """
    pairs = dict(pair.partition("=")[::2] for pair in shape_key.split(","))
    values: list[str] = []
    words: list[str] = []
    for name, value in pairs.items():
        if name in FLAG_WORDS:
            words.extend([FLAG_WORDS[name][value]] if value in FLAG_WORDS[name] else [])
        elif name == "kv_heads":
            words.extend([f"kv {value}"] if value != pairs.get("heads") else [])
        else:
            number = int(value) if value.isdigit() else None
            big_power = number is not None and number >= 1 << 16 and number & (number - 1) == 0
            values.append(f"2^{number.bit_length() - 1}" if big_power and number is not None else value)
    return " ".join(["×".join(values), *words])


#: The ratios labelled on the log axis (those in view).
RATIO_TICKS = (0.1, 0.2, 0.3, 0.5, 0.7, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 50.0, 100.0)

Series = dict[str, tuple[str, str, list[tuple[float, float, float] | None]]]
"""A legend label -> its colour, its marker and, per key, ``(median, p10, p90)`` ms or ``None``."""


def _ratio_dots(axis: Axes, labels: list[str], series: Series, *, reference: str) -> None:
    """Per key, one dot per series at its median over ``reference``'s median, whiskers p10 to p90.

    A log axis: 2× slower and 2× faster sit as far from 1 on either side.
    """
    positions = np.arange(len(labels))
    step = 0.7 / len(series)
    divisors = [times[0] if times else math.nan for times in series[reference][2]]
    for index, (label, (colour, marker, per_key)) in enumerate(series.items()):
        ratios = np.array(
            [
                [t / divisor for t in times] if times else [math.nan] * 3
                for times, divisor in zip(per_key, divisors, strict=True)
            ]
        )
        median, low, high = ratios[:, 0], ratios[:, 1], ratios[:, 2]
        axis.errorbar(
            positions + (index - (len(series) - 1) / 2) * step,
            median,
            yerr=[median - low, high - median],
            fmt=marker,
            color=colour,
            markersize=7,
            linewidth=1,
            capsize=2,
            label=label,
        )
    axis.set_xticks(positions, labels, fontsize=8)
    axis.set_xlim(-0.5, len(labels) - 0.5)
    axis.axhline(1.0, color="black", linewidth=0.8)
    axis.set_yscale("log")
    axis.yaxis.set_major_locator(ticker.FixedLocator(RATIO_TICKS))
    axis.yaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}×"))
    axis.yaxis.set_minor_formatter(ticker.NullFormatter())
    for boundary in positions[1:] - 0.5:
        axis.axvline(boundary, color="grey", linewidth=0.5, alpha=0.4)
    axis.grid(True, axis="y", which="both", alpha=0.3)


def _spread(times: dict[str, Any] | None) -> tuple[float, float, float] | None:
    """``(median, p10, p90)`` ms of one measurement in a ``tuning_quality`` document."""
    if times is None:
        return None
    return times["median_ms"], times["p10_ms"], times["p90_ms"]


def plot_tuning_quality(document: dict[str, Any]) -> Figure:
    """Per key, the default's, the exhaustive best's and the vendor op's time over the tuned config's."""
    keys: list[dict[str, Any]] = document["keys"]
    labels = [
        f"{k['kernel'].replace('_', ' ')}\n{shape_label(k['shape'])}".replace(" causal", "\ncausal")
        for k in keys
    ]
    series: Series = {
        "default rule": ("tab:grey", "s", [_spread(k["times"].get("default")) for k in keys]),
        "tuned (15 % of the space)": ("tab:blue", "o", [_spread(k["times"]["tuned"]) for k in keys]),
        "exhaustive best": ("tab:green", "D", [_spread(k["times"]["exhaustive"]) for k in keys]),
        "torch op (SDPA for attention)": ("tab:orange", "^", [_spread(k["times"]["vendor"]) for k in keys]),
    }
    figure, axis = plt.subplots(figsize=(max(8.0, 1.25 * len(keys) + 2), 4.6))
    _ratio_dots(axis, labels, series, reference="tuned (15 % of the space)")
    axis.set_ylabel("time ÷ the tuned config's time\n(above 1: slower than tuned)")
    summary = document["summary"]
    axis.set_title(
        f"Tuning quality: {document['family']} kernels, fp32, on {document['chip']}\n"
        f"tuned / exhaustive: median {summary['median_tuned_over_exhaustive']:.3f}, "
        f"worst {summary['worst_tuned_over_exhaustive']:.3f} "
        "(medians of one interleaved run per key; whiskers p10–p90)",
        fontsize=9,
    )
    axis.legend(fontsize=8, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.16))
    figure.tight_layout()
    return figure


def plot_gpu_check(document: dict[str, Any]) -> Figure:
    """Per key, the tuned and the default config's time over PyTorch's own op; the goals' lines."""
    keys: list[dict[str, Any]] = document["keys"]
    labels = [
        f"{k['kernel'].removeprefix('triton_').replace('_', ' ')} {k['dtype'].replace('float', 'fp')}"
        f"\n{shape_label(k['shape'])}".replace(" causal", "\ncausal")
        for k in keys
    ]

    def times(name: str) -> list[tuple[float, float, float] | None]:
        found = [k["times_ms"].get(name) for k in keys]
        return [(ms, ms, ms) if ms is not None else None for ms in found]

    series: Series = {
        "default rule": ("tab:grey", "s", times("default")),
        "tuned": ("tab:blue", "o", times("tuned")),
        "PyTorch (flash SDPA; torch.matmul)": ("tab:orange", "^", times("torch")),
    }
    families = document.get("families")
    width = max(8.0, 1.2 * len(keys) + 2)
    if families is None:
        figure, axis = plt.subplots(figsize=(width, 4.6))
    else:
        figure, (axis, family_axis) = plt.subplots(
            1, 2, figsize=(width + 6, 4.6), gridspec_kw={"width_ratios": [len(keys), 5]}
        )
        _plot_families(family_axis, families)
    _ratio_dots(axis, labels, series, reference="PyTorch (flash SDPA; torch.matmul)")
    axis.axhline(
        1.2, color="tab:red", linewidth=0.8, linestyle=":", label="goal: attention ≤ 1.2× flash SDPA"
    )
    axis.set_ylabel("time ÷ PyTorch's op's time\n(above 1: slower than PyTorch)")
    summary = document["summary"]
    axis.set_title(
        f"Triton kernels on {document['device']}, torch {document['torch']}\n"
        f"attention: worst {summary['worst_attention_over_flash_sdpa']:.2f}× flash SDPA's time, median "
        f"speedup over the default {summary['median_attention_speedup_vs_default']:.2f}× "
        "(medians of one interleaved run per key)",
        fontsize=9,
    )
    axis.legend(fontsize=8, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.16))
    figure.tight_layout()
    return figure


def _plot_families(axis: Axes, families: dict[str, Any]) -> None:
    """Each Triton kernel's default config, time over torch's op's (where torch has one on CUDA);
    a cross marks a kernel whose output missed its reference."""
    rows = [i for i in families["implementations"] if "times_ms" in i or not i.get("correct", True)]
    positions = np.arange(len(rows))[::-1]
    ratios = [i.get("triton_over_torch") or 0.0 for i in rows]
    colours = ["tab:blue" if i.get("correct") else "tab:red" for i in rows]
    axis.barh(positions, ratios, color=colours)
    for position, row in zip(positions, rows, strict=True):
        if not row.get("correct"):
            axis.plot([0.05], [position], marker="x", color="tab:red")
    axis.axvline(1.0, color="black", linewidth=0.8)
    labels = [f"{i['kernel'].replace('_', ' ')} {i['dtype'].replace('float', 'fp')}" for i in rows]
    axis.set_yticks(positions, labels, fontsize=7)
    axis.set_xlabel("Triton default's time ÷ torch's op's\n(red: missed its reference; 0: no torch op)")
    goals = families["goals"]
    axis.set_title(
        f"every family's Triton kernel: correct {goals['every_triton_kernel_correct']}, "
        f"tuned keys never slower than torch {goals['no_tuned_key_slower_than_torch']}",
        fontsize=8,
    )


def plot_untuned_choice(document: dict[str, Any]) -> Figure:
    """Per key, the rule's time over torch's op's (and what an untuned call runs); beside it, what an
    untuned call adds to torch's per call: the operators on tiny tensors, and (red) at a model's
    size right after a large matmul."""
    keys: list[dict[str, Any]] = document["keys"]
    timed = [k for k in keys if k["rule_over_vendor"] is not None]
    figure, (ratio_axis, cost_axis) = plt.subplots(
        1, 2, figsize=(13, max(4.0, 0.32 * len(timed) + 1.5)), gridspec_kw={"width_ratios": [3, 1]}
    )
    positions = np.arange(len(timed))[::-1]
    colours = ["tab:blue" if k["untuned_runs"] == "rule" else "tab:orange" for k in timed]
    ratio_axis.barh(positions, [k["rule_over_vendor"] for k in timed], color=colours)
    ratio_axis.axvline(1.0, color="black", linewidth=0.8)
    ratio_axis.set_xscale("log")
    ratio_axis.set_yticks(positions, [f"{k['kernel']} {shape_label(k['shape'])}" for k in timed], fontsize=7)
    ratio_axis.set_xlabel(
        "the rule's time ÷ torch's op's (blue: untuned calls run the rule; orange: torch's op)"
    )
    ratio_axis.grid(True, axis="x", alpha=0.3)
    added = {
        f"{name}\n(tiny, warm)": cost["added_us"] for name, cost in document["overhead"]["operators"].items()
    }
    cold = document.get("cold", {}).get("calls", {})  # runs before the cold part have none
    added |= {f"{name}\n(after a matmul)": cost["added_us"] for name, cost in cold.items()}
    places = np.arange(len(added))
    cost_axis.bar(
        places, list(added.values()), color=["tab:blue"] * (len(added) - len(cold)) + ["tab:red"] * len(cold)
    )
    cost_axis.set_xticks(places, list(added), fontsize=6, rotation=60)
    cost_axis.set_ylabel("µs a call adds to torch's")
    cost_axis.axhline(0.0, color="black", linewidth=0.8)
    figure.suptitle(
        f"What an untuned call runs, on {document['chip']} (fp32): rule faster at every key for "
        f"{', '.join(document['rule_faster_at_every_key']) or 'no kernel'}",
        fontsize=9,
    )
    figure.tight_layout()
    return figure
