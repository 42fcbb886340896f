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
from collections.abc import Callable, Mapping, Sequence


def budget_trials(valid_count: int, pct: float) -> int:
    """Unique valid measurements that make ``pct`` percent of a valid space (at least 1)."""
    return max(1, math.ceil(valid_count * pct / 100.0))


def fraction_at(history: Sequence[float], trials: int, optimum_ms: float) -> float:
    """Optimum time over the best time within the first ``trials`` measurements (0 if none)."""
    if not history or trials < 1:
        return 0.0
    best = history[min(trials, len(history)) - 1]
    return optimum_ms / best if math.isfinite(best) else 0.0


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
