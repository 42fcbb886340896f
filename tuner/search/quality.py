"""How good a search run was on a recorded space, and how settings are chosen without the judge.

A run is summarised by its *history*: the best time so far after each unique
valid measurement (``Search.history``). Its quality after ``t`` measurements is
the *fraction of the optimum*, ``optimum_ms / history[t - 1]`` (1 = the
optimum found; 0 before any success).

Contract:

- :func:`budget_trials` turns a percentage of the valid space into a number of
  measurements (at least 1, rounded up); :func:`fraction_at` reads the fraction
  after that many (a run that stopped early keeps its last best).
- :func:`log_auc` is the area under the fraction-of-optimum curve between two
  budgets with the budget on a log axis, divided by the axis length: the mean
  fraction when every doubling of the budget weighs the same (1 = the optimum
  from the first budget on). The curve is a step function of the measurement
  count and is integrated exactly.
- :func:`trials_to_reach` is the number of measurements after which a run first
  reaches a fraction of the optimum (``None`` if it never does): the budget a seed
  needed, so the tail of a search reads as "the worst seed needed N measurements";
  :func:`budget_needed` summarises it over seeds, in % of the valid space.
- :func:`device_of` names the device of a recorded space from its file name
  (``<kernel>_<device>``, e.g. ``gemm_RTX_3090`` -> ``RTX_3090``; device names
  in the files are not reliable, one is empty).
- :func:`choose_leave_one_device_out` picks, for each device, the candidate with
  the best score over the spaces of *other* devices only (ties: the first
  candidate in order), so the figures of a device's spaces never choose the
  settings they are judged with.

Imports the standard library only.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def budget_trials(valid_count: int, pct: float) -> int:
    """Unique valid measurements that make ``pct`` percent of a valid space (at least 1)."""
    return max(1, math.ceil(valid_count * pct / 100.0))


def fraction_at(history: Sequence[float], trials: int, optimum_ms: float) -> float:
    """Optimum time over the best time within the first ``trials`` measurements (0 if none)."""
    if not history or trials < 1:
        return 0.0
    best = history[min(trials, len(history)) - 1]
    return optimum_ms / best if math.isfinite(best) else 0.0


def trials_to_reach(history: Sequence[float], optimum_ms: float, reach: float) -> int | None:
    """Measurements after which the best so far first reaches ``reach`` of the optimum, or ``None``.

    Raises ``ValueError`` unless ``0 < reach <= 1``.
    """
    if not 0.0 < reach <= 1.0:
        raise ValueError(f"reach: must be in (0, 1], got {reach}")
    for trials, best in enumerate(history, start=1):
        if math.isfinite(best) and optimum_ms / best >= reach:
            return trials
    return None


def budget_needed(needed: Sequence[int | None], valid_count: int) -> dict[str, Any]:
    """Per seed the % of the valid space measured before it first reached (``trials_to_reach``).

    ``median`` and ``worst`` are over the seeds, a seed that never reached counting as
    infinite; a statistic (or seed) that is infinite is shown as ``None``. Raises
    ``ValueError`` for no seeds.
    """
    if not needed:
        raise ValueError("needed: no seeds")
    pcts = [math.inf if n is None else 100.0 * n / valid_count for n in needed]

    def shown(pct: float) -> float | None:
        return round(pct, 2) if math.isfinite(pct) else None

    return {
        "median": shown(statistics.median(pcts)),
        "worst": shown(max(pcts)),
        "per_seed": [shown(pct) for pct in pcts],
    }


def log_auc(history: Sequence[float], optimum_ms: float, first: int, last: int) -> float:
    """Mean fraction of the optimum over budgets ``first`` .. ``last`` measurements, log axis.

    The fraction after ``t`` measurements holds on ``[t, t + 1)``; the area is
    taken over ``[first, last]`` in ``log t`` and divided by ``log(last / first)``.
    ``first == last`` gives the fraction at that budget. Raises ``ValueError``
    unless ``1 <= first <= last``.
    """
    if not 1 <= first <= last:
        raise ValueError(f"budgets: need 1 <= first <= last, got {first} and {last}")
    if first == last:
        return fraction_at(history, first, optimum_ms)
    area = 0.0
    for t in range(first, last):
        area += fraction_at(history, t, optimum_ms) * math.log((t + 1) / t)
    return area / math.log(last / first)


def device_of(space_name: str) -> str:
    """The device part of a recorded space's name: all after the first ``_``."""
    kernel, separator, device = space_name.partition("_")
    if not separator or not kernel or not device:
        raise ValueError(f"space name {space_name!r} is not <kernel>_<device>")
    return device


def choose_leave_one_device_out(
    scores: Mapping[str, Mapping[str, float]],
    device: Callable[[str], str] = device_of,
) -> dict[str, str]:
    """For each device, the candidate whose mean score over the other devices' spaces is highest.

    ``scores`` maps a candidate's label to its score per space (higher is
    better; every candidate scored on the same spaces). Returns device ->
    label. Raises ``ValueError`` when there are no candidates, the candidates
    were scored on different spaces, or only one device is present (nothing
    would be left to choose on).
    """
    if not scores:
        raise ValueError("scores: no candidates")
    labels = list(scores)
    spaces = sorted(scores[labels[0]])
    if any(sorted(scores[label]) != spaces for label in labels):
        raise ValueError("scores: every candidate must be scored on the same spaces")
    devices = sorted({device(space) for space in spaces})
    if len(devices) < 2:
        raise ValueError("scores: leaving one device out needs spaces of at least two devices")
    chosen: dict[str, str] = {}
    for held_out in devices:
        training = [space for space in spaces if device(space) != held_out]
        means = [sum(scores[label][space] for space in training) / len(training) for label in labels]
        chosen[held_out] = labels[means.index(max(means))]
    return chosen
