"""The job page's figures and numbers, built from its trials' rows in one pass (no SQL here).

Rows are plain tuples (:data:`TRIAL_COLUMNS`), as :mod:`.job_page` selects them; nothing here
touches the store, so each rule is a pure function with its own tests:

- :func:`eta_seconds`: the time left, from the rate at which the job's search trials were told;
- :func:`influences`: how much of the spread of ``log(time)`` each knob explains (the heat map
  shows the two that explain most);
- :func:`job_figures`: the four charts (best so far, every trial, the heat map, parallel
  coordinates) from the measured search trials, each a Plotly figure for ``m.chart``.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from tiletune.service.dashboard.render import LOG_AXIS, figure

#: The charts' element ids (tests read their points by these ids).
CHART_IDS = ("chart-best", "chart-trials", "chart-heatmap", "chart-knobs")
#: How many of the newest told trials set the rate of the ETA (the recent pace, not the start's).
ETA_WINDOW = 50


class TrialTuple(NamedTuple):
    """One trial as the job page selects it (columns in this order)."""

    number: int | None
    phase: str
    config: Mapping[str, Any]
    state: str
    median_ms: float | None
    p10_ms: float | None
    p90_ms: float | None
    samples: int | None
    reason: str | None
    told_at: datetime | None
    conditions: Mapping[str, Any] | None = None


def eta_seconds(told_at: Sequence[datetime], done: int, budget: int) -> float | None:
    """Seconds until ``budget`` search trials are told, at the pace of the newest ones.

    The pace is the number of tells between the oldest and newest of the last
    :data:`ETA_WINDOW` told times (sorted), over the time between them. ``None`` when that is
    unknown: fewer than two tells, or all at the same instant. ``0`` when the budget is spent.
    """
    if done >= budget:
        return 0.0
    recent = sorted(told_at)[-ETA_WINDOW:]
    if len(recent) < 2:
        return None
    span = (recent[-1] - recent[0]).total_seconds()
    if span <= 0:
        return None
    rate = (len(recent) - 1) / span
    return (budget - done) / rate


def format_duration(seconds: float | None) -> str | None:
    """``1 h 02 min``, ``3 min 05 s`` or ``42 s``; ``None`` when unknown."""
    if seconds is None:
        return None
    whole = max(0, round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} min"
    if minutes:
        return f"{minutes} min {secs:02d} s"
    return f"{secs} s"


def influences(configs: Sequence[Mapping[str, Any]], times_ms: Sequence[float]) -> dict[str, float]:
    """Each knob that varies → the share of the variance of ``log(time)`` it explains (0 … 1).

    The rule: group the measured trials by the knob's value (``k`` groups of ``n`` trials) and
    take the between-groups sum of squares of ``log(time)`` over its total sum of squares,
    adjusted for the number of groups (ε²: ``(SSB - (k - 1)·SSW/(n - k)) / SST``, at least 0),
    so that a knob does not explain much merely by having many values among few trials. A knob
    with as many values as trials explains 0 (no trial shares a value to compare with); knobs
    with a single value are left out; with no spread in time at all every knob gets 0.
    """
    logs = [math.log(t) for t in times_ms]
    if len(logs) < 2:
        return {}
    n = len(logs)
    mean = statistics.fmean(logs)
    total = sum((v - mean) ** 2 for v in logs)
    knobs = {name for config in configs for name in config}
    shares: dict[str, float] = {}
    for knob in sorted(knobs):
        groups: dict[str, list[float]] = defaultdict(list)
        for config, value in zip(configs, logs, strict=True):
            groups[_label(config.get(knob))].append(value)
        k = len(groups)
        if k < 2:
            continue
        if total <= 0 or n <= k:
            shares[knob] = 0.0
            continue
        between = sum(len(g) * (statistics.fmean(g) - mean) ** 2 for g in groups.values())
        within = total - between
        shares[knob] = max(0.0, min(1.0, (between - (k - 1) * within / (n - k)) / total))
    return shares


def _label(value: Any) -> str:
    return "—" if value is None else str(value)


def _sort_labels(values: set[Any]) -> list[Any]:
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
    return sorted(values) if numbers else sorted(values, key=_label)


@dataclass(frozen=True)
class JobFigures:
    """The four figures, by chart id, and the heat map's knobs (``None``: skipped, see ``note``)."""

    figures: dict[str, dict[str, Any]]
    heatmap_knobs: tuple[str, str] | None
    note: str | None


def _default_trace(default_ms: float | None, numbers: Sequence[int]) -> list[dict[str, Any]]:
    if default_ms is None or not numbers:
        return []
    ends = [min(numbers), max(numbers)]
    line = {"dash": "dash", "color": "#888"}
    return [
        {
            "type": "scatter",
            "mode": "lines",
            "name": "default",
            "x": ends,
            "y": [default_ms] * 2,
            "line": line,
        }
    ]


def _best_figure(numbers: list[int], times: list[float], default_ms: float | None) -> dict[str, Any]:
    best: list[float] = []
    low = math.inf
    for value in times:
        low = min(low, value)
        best.append(low)
    trace: dict[str, Any] = {
        "type": "scatter",
        "mode": "lines+markers",
        "name": "best so far",
        "x": numbers,
        "y": best,
    }
    trace["line"] = {"shape": "hv"}
    layout = {"xaxis": {"title": {"text": "trial number"}}, "yaxis": {"title": {"text": "best median (ms)"}}}
    return figure([trace, *_default_trace(default_ms, numbers)], layout)


def _trials_figure(numbers: list[int], times: list[float], default_ms: float | None) -> dict[str, Any]:
    trace: dict[str, Any] = {
        "type": "scatter",
        "mode": "markers",
        "name": "measured",
        "x": numbers,
        "y": times,
    }
    trace["marker"] = {"size": 5, "opacity": 0.7}
    layout = {
        "xaxis": {"title": {"text": "trial number"}},
        "yaxis": {**LOG_AXIS, "title": {"text": "median (ms)"}},
    }
    return figure([trace, *_default_trace(default_ms, numbers)], layout)


def _heatmap_figure(
    configs: list[Mapping[str, Any]], times: list[float], shares: dict[str, float]
) -> tuple[dict[str, Any], tuple[str, str] | None, str | None]:
    if len(shares) < 2:
        note = "fewer than two knobs vary among the measured trials: no heat map"
        layout: dict[str, Any] = {
            "annotations": [{"text": note, "showarrow": False, "xref": "paper", "yref": "paper"}]
        }
        layout |= {"xaxis": {"visible": False}, "yaxis": {"visible": False}}
        return figure([], layout), None, note
    first, second = sorted(shares, key=lambda knob: (-shares[knob], knob))[:2]
    cells: dict[tuple[str, str], list[float]] = defaultdict(list)
    xs: set[Any] = set()
    ys: set[Any] = set()
    for config, value in zip(configs, times, strict=True):
        x, y = config.get(first), config.get(second)
        xs.add(x)
        ys.add(y)
        cells[(_label(x), _label(y))].append(value)
    x_labels = [_label(v) for v in _sort_labels(xs)]
    y_labels = [_label(v) for v in _sort_labels(ys)]
    z = [[statistics.median(cells[(x, y)]) if (x, y) in cells else None for x in x_labels] for y in y_labels]
    trace = {
        "type": "heatmap",
        "name": "median (ms)",
        "x": x_labels,
        "y": y_labels,
        "z": z,
        "colorscale": "Viridis",
        "reversescale": True,
        "colorbar": {"title": {"text": "ms"}},
        "hoverongaps": False,
    }
    layout = {
        "xaxis": {"title": {"text": f"{first} (explains {shares[first]:.0%})"}, "type": "category"},
        "yaxis": {"title": {"text": f"{second} (explains {shares[second]:.0%})"}, "type": "category"},
    }
    return figure([trace], layout), (first, second), None


def _knobs_figure(configs: list[Mapping[str, Any]], times: list[float]) -> dict[str, Any]:
    knobs = sorted({name for config in configs for name in config})
    dimensions: list[dict[str, Any]] = []
    for knob in knobs:
        column = [config.get(knob) for config in configs]
        present = {v for v in column if v is not None}
        if all(isinstance(v, int | float) and not isinstance(v, bool) for v in present):
            dimensions.append({"label": knob, "values": column})
            continue
        order = _sort_labels(present)
        index = {value: i for i, value in enumerate(order)}
        dimensions.append(
            {
                "label": knob,
                "values": [index.get(v) for v in column],
                "tickvals": list(range(len(order))),
                "ticktext": [_label(v) for v in order],
            }
        )
    logs = [round(math.log10(t), 6) for t in times]
    dimensions.append({"label": "log10 ms", "values": logs})
    line: dict[str, Any] = {"color": logs, "colorscale": "Viridis", "reversescale": True, "showscale": True}
    line["colorbar"] = {"title": {"text": "log10 ms"}}
    trace = {"type": "parcoords", "name": "measured", "dimensions": dimensions, "line": line}
    return figure([trace], {"margin": {"l": 60, "r": 60, "t": 50, "b": 30}})


def job_figures(trials: Sequence[TrialTuple], default_ms: float | None) -> JobFigures:
    """The page's four figures from its trials: measured search trials, in trial-number order."""
    measured = sorted(
        (t for t in trials if t.phase == "search" and t.state == "measured" and t.median_ms is not None),
        key=lambda t: t.number if t.number is not None else -1,
    )
    numbers = [t.number if t.number is not None else -1 for t in measured]
    times = [float(t.median_ms or 0.0) for t in measured]
    configs = [t.config for t in measured]
    heatmap, knobs, note = _heatmap_figure(configs, times, influences(configs, times))
    figures = {
        "chart-best": _best_figure(numbers, times, default_ms),
        "chart-trials": _trials_figure(numbers, times, default_ms),
        "chart-heatmap": heatmap,
        "chart-knobs": _knobs_figure(configs, times),
    }
    return JobFigures(figures, knobs, note)
