"""The encoding of a search space: configs as keys (value indices) and as Optuna params.

Contract: a *config* maps every knob to one of its values; its *key* is the
tuple of the values' indices in knob order (adjacent indices are adjacent
values). :class:`Encoding` converts between configs, keys and the params of
Optuna trials (an ``IntDistribution`` over the indices of each knob with more
than one value), enumerates the knob product and walks a key's one-knob and
two-knob neighbours. It checks the knobs once (ints, distinct, non-empty) and
raises ``ValueError`` naming the knob; it knows nothing of constraints or times.

Imports numpy, optuna's distributions and the standard library only.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from optuna.distributions import BaseDistribution, IntDistribution

Config = dict[str, int]
#: A config as the tuple of its value indices, in knob order (the internal form).
Key = tuple[int, ...]


class Encoding:
    """Maps configs to keys (tuples of value indices in knob order) and to Optuna params."""

    def __init__(self, knobs: Mapping[str, Sequence[int]]) -> None:
        if not knobs:
            raise ValueError("knobs: the search space has no knobs")
        self.names = list(knobs)
        self.values = [tuple(knobs[name]) for name in self.names]
        for name, values in zip(self.names, self.values, strict=True):
            check_knob(name, values)
        self.sizes = [len(values) for values in self.values]
        self.index = [{value: i for i, value in enumerate(values)} for values in self.values]
        self.free = [i for i, size in enumerate(self.sizes) if size > 1]
        self.distributions: dict[str, BaseDistribution] = {
            self.names[i]: IntDistribution(0, self.sizes[i] - 1) for i in self.free
        }
        self.product_size = math.prod(self.sizes)

    def config(self, key: Key) -> Config:
        return {name: values[i] for name, values, i in zip(self.names, self.values, key, strict=True)}

    def key(self, config: Mapping[str, int]) -> Key:
        """The key of a config; raises ``ValueError`` for a missing knob or an unknown value."""
        try:
            return tuple(index[config[name]] for name, index in zip(self.names, self.index, strict=True))
        except (KeyError, TypeError):
            raise ValueError(f"config {dict(config)} is outside the space's knobs and values") from None

    def params(self, key: Key) -> dict[str, int]:
        return {self.names[i]: key[i] for i in self.free}

    def key_from_params(self, params: Mapping[str, Any]) -> Key:
        return tuple(int(params.get(name, 0)) for name in self.names)

    def keys_from_samples(self, samples: Mapping[str, Any]) -> list[Key] | None:
        """Keys of TPE's candidate samples (internal repr: an index per free knob), if complete."""
        if not self.free or any(self.names[i] not in samples for i in self.free):
            return None
        count = len(samples[self.names[self.free[0]]])
        columns = [
            np.rint(samples[name]).astype(int).tolist() if name in samples else [0] * count
            for name in self.names
        ]
        return list(zip(*columns, strict=True))

    def all_keys(self) -> Iterator[Key]:
        return itertools.product(*(range(size) for size in self.sizes))

    def neighbours(self, key: Key) -> Iterator[Key]:
        """Keys that differ from ``key`` in one knob, nearest values first."""
        radius = max((self.sizes[i] for i in self.free), default=0)
        for distance in range(1, radius):
            for i in self.free:
                for position in (key[i] - distance, key[i] + distance):
                    if 0 <= position < self.sizes[i]:
                        yield (*key[:i], position, *key[i + 1 :])

    def pair_neighbours(self, key: Key) -> Iterator[Key]:
        """Keys that differ from ``key`` in exactly two knobs."""
        for i, j in itertools.combinations(self.free, 2):
            others_i = [v for v in range(self.sizes[i]) if v != key[i]]
            others_j = [v for v in range(self.sizes[j]) if v != key[j]]
            for vi, vj in itertools.product(others_i, others_j):
                near = list(key)
                near[i], near[j] = vi, vj
                yield tuple(near)


def check_knob(name: str, values: Sequence[int]) -> None:
    """Raise ``ValueError`` naming the knob unless its values are distinct ints, at least one."""
    if not values:
        raise ValueError(f"knobs: knob {name!r} has no values")
    if any(isinstance(value, bool) or not isinstance(value, int) for value in values):
        raise ValueError(f"knobs: knob {name!r} has a non-integer value")
    if len(set(values)) != len(values):
        raise ValueError(f"knobs: knob {name!r} repeats a value")
