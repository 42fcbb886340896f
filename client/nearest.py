"""Distance between shapes of one kernel, for the nearest-shape fallback and warm starts.

Contract: two shapes are comparable only when they have the same dims and
agree on every categorical dim (``causal``: a causal shape never stands in
for a non-causal one). Their distance is the sum over size dims of
``|log2(a) - log2(b)|``: doubling any one dim costs 1, whatever its scale.
Ties are broken by the canonical shape string, so the answer is deterministic.

Standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from typing import TypeVar

T = TypeVar("T")


def shape_distance(a: Mapping[str, int], b: Mapping[str, int], categorical: Collection[str]) -> float | None:
    """The distance between ``a`` and ``b``, or ``None`` when they are not comparable."""
    if a.keys() != b.keys():
        return None
    total = 0.0
    for name, value in a.items():
        other = b[name]
        if name in categorical:
            if value != other:
                return None
        elif value <= 0 or other <= 0:
            return None
        else:
            total += abs(math.log2(value) - math.log2(other))
    return total


def nearest(
    shape: Mapping[str, int],
    candidates: Iterable[tuple[Mapping[str, int], str, T]],
    categorical: Collection[str],
    k: int = 1,
) -> list[tuple[float, T]]:
    """The ``k`` comparable candidates ``(shape, shape_key, item)`` closest to ``shape``, closest first."""
    scored: list[tuple[float, str, T]] = []
    for other, key, item in candidates:
        distance = shape_distance(shape, other, categorical)
        if distance is not None:
            scored.append((distance, key, item))
    scored.sort(key=lambda entry: (entry[0], entry[1]))
    return [(distance, item) for distance, _, item in scored[:k]]
