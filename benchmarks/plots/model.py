"""A model on tiletune's operators: ``model_step``."""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from benchmarks.plots.kernels import Series, _ratio_dots

#: The prefix of the goals judged on training steps.
TRAINING = "training_"
#: Each variant's colour and marker, by its letter.
STYLES = {
    "a": ("tab:grey", "s"),
    "b": ("black", "D"),
    "c": ("tab:orange", "^"),
    "d": ("tab:blue", "o"),
    "e": ("tab:purple", "v"),
}
#: The operators' colours in the profile's bars.
OPERATOR_COLOURS = {
    "matmul": "tab:blue",
    "fused_attention": "tab:green",
    "rms_norm": "tab:orange",
    "softmax": "tab:red",
    "add": "tab:brown",
    # a backward operator: its forward's hue, lighter
    "fused_attention_backward": "yellowgreen",
    "rms_norm_backward": "navajowhite",
    "softmax_backward": "lightcoral",
}


def _times(document: dict[str, Any]) -> tuple[list[str], Series]:
    """Per (sequence, step) label, each variant's ``(median, p10, p90)`` ms."""
    sequences: list[dict[str, Any]] = document["sequences"]
    batch = document["model"].get("batch", 1)
    labels = [f"{batch}×{s['seq']}\n{kind}" for s in sequences for kind in ("inference", "training")]
    series: Series = {}
    for name, label in document["variants"].items():
        colour, marker = STYLES.get(name, ("tab:cyan", "x"))
        per_key: list[tuple[float, float, float] | None] = []
        for sequence in sequences:
            for kind in ("inference", "training"):
                times = sequence["times"][name][kind]
                per_key.append((times["median_ms"], times["p10_ms"], times["p90_ms"]))
        series[f"({name}) {label}"] = (colour, marker, per_key)
    return labels, series


def _profile(axis: Axes, document: dict[str, Any]) -> None:
    """(d)'s step under the profiler: each operator's share of the CPU time (its own and the torch
    ops it ran), stacked, per sequence and step; the lookups' share written beside."""
    rows = [(s, kind) for s in document["sequences"] for kind in ("inference", "training")]
    positions = np.arange(len(rows))[::-1]
    seen: set[str] = set()
    for position, (sequence, kind) in zip(positions, rows, strict=True):
        left = 0.0
        for name, operator in sorted(sequence["profile"][kind]["operators"].items()):
            share = 100 * operator["total_share"]
            label = name if name not in seen else None
            seen.add(name)
            axis.barh(position, share, left=left, color=OPERATOR_COLOURS.get(name, "tab:cyan"), label=label)
            left += share
        lookups = sequence["lookups"][kind]
        note = f"lookups: {100 * lookups['get_share_of_step']:.3f} % of the step" if lookups else "no lookups"
        axis.annotate(
            note, (left, position), xytext=(4, 0), textcoords="offset points", va="center", fontsize=8
        )
    axis.set_yticks(positions, [f"seq {s['seq']} {kind}" for s, kind in rows], fontsize=8)
    axis.set_xlim(0, 130)
    axis.set_xlabel("% of (d)'s profiled CPU time in tiletune::* operators")
    axis.legend(fontsize=8, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.14))
    axis.grid(True, axis="x", alpha=0.3)


def _goals_line(document: dict[str, Any], prefix: str = "") -> str:
    """The goals as measured, one phrase each: the inference goals, or with ``prefix``
    ``training_`` the training goals (a document from before them: none)."""
    goals = document["goals"]
    parts = []
    for name, goal in goals.items():
        if name.startswith(TRAINING) != (prefix == TRAINING):
            continue
        ratio = name.removeprefix(prefix)
        sense = "≤" if goal["sense"] == "le" else "≥"
        bound = f"{100 * goal['bound']:g} %" if ratio == "lookups_share" else f"{goal['bound']:g}"
        what = ratio.replace("_over_", "/").replace("lookups_share", "lookups").replace("_at_", " at ")
        text = f"{what} {sense} {bound}"
        shown = "{:.3%}" if ratio == "lookups_share" else "{:.2f}"
        values = ", ".join(
            shown.format(value) if value is not None else "–" for value in goal["values"].values()
        )
        parts.append(f"{text}: {values} {'met' if goal['met'] else 'NOT met'}")
    return "; ".join(parts)


def plot_model_step(document: dict[str, Any]) -> Figure:
    """Each variant's step time over torch eager's, per sequence and step; (d)'s profile."""
    labels, series = _times(document)
    figure, (times_axis, profile_axis) = plt.subplots(
        1, 2, figsize=(13, 5.2), gridspec_kw={"width_ratios": [max(2, len(labels)), 3]}
    )
    _ratio_dots(times_axis, labels, series, reference=next(iter(series)))
    times_axis.set_ylabel("step time ÷ torch eager's\n(below 1: faster than eager)")
    times_axis.legend(fontsize=8, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.14))
    _profile(profile_axis, document)
    model, tuning = document["model"], document["tuning"]
    figure.suptitle(
        f"A {model['layers']}-layer {model.get('kind', 'decoder')} (hidden {model['hidden']}, "
        f"{model['heads']}/{model['kv_heads']} "
        f"heads, batch {model['batch']}) on {document['machine']['cpu_count']} shared CPU cores; "
        f"(d) tuned by {tuning['path']} ({tuning['jobs']} jobs × {tuning['trials_per_job']} trials)\n"
        f"inference goals, per sequence: {_goals_line(document)}\n"
        f"training goals: {_goals_line(document, 'training_') or 'not measured'}\n"
        f"medians of {document['repeats']} round-robin rounds, whiskers p10–p90",
        fontsize=9,
    )
    figure.tight_layout()
    return figure


#: The colours of a tuned key's phases (``local_tune``).
PHASE_COLOURS = {
    "prepare": "tab:grey",
    "trials": "tab:blue",
    "search": "tab:orange",
    "validate": "tab:green",
}


def plot_local_tune(document: dict[str, Any]) -> Figure:
    """``local_tune``: each key's seconds, split into its phases, with the run's total against the
    goal's bound in the title."""
    keys: list[dict[str, Any]] = document["keys"]
    figure, axis = plt.subplots(figsize=(11, 0.32 * len(keys) + 2.0), layout="constrained")
    positions = np.arange(len(keys))[::-1]
    left = np.zeros(len(keys))
    for phase, colour in PHASE_COLOURS.items():
        widths = np.array([key["phases"].get(phase, 0.0) for key in keys])
        axis.barh(positions, widths, left=left, color=colour, label=phase)
        left += widths
    rest = np.array([key["seconds"] for key in keys]) - left
    axis.barh(positions, np.clip(rest, 0.0, None), left=left, color="lightgrey", label="other")
    labels = [f"{key['kernel']} {key['shape']}"[:64] for key in keys]
    for position, key in zip(positions, keys, strict=True):
        answer = key["implementation"] or "failed"
        axis.annotate(f" {answer}", (key["seconds"], position), va="center", fontsize=7)
    axis.set_yticks(positions, labels, fontsize=6)
    axis.set_xlabel("seconds")
    goal, model, again = document["goal"], document["model"], document["second_run"]
    verdict = "met" if goal["met"] else "missed"
    axis.set_title(
        f"{len(keys)} keys of {model['kind']} at {model['seq']} tokens, {document['trials_per_key']} "
        f"trials each: {document['total_s']:.0f} s (goal ≤ {goal['bound_s']:.0f} s; {verdict})\n"
        f"second run: {again['exact']} of {again['keys']} keys exact, {again['tuned']} tuned",
        fontsize=9,
    )
    axis.legend(loc="lower right", fontsize=8)
    return figure
