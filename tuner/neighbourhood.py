"""Local search: unmeasured valid neighbours (one knob changed) of the best configs so far.

Contract: :class:`LocalSearch` proposes a key that ``usable`` accepts among the
one-knob neighbours of the ``top`` best measured keys, or ``None`` when none
has one. Turns alternate between a sweep (the nearest usable neighbour of the
best key that has one, so no direct improvement of the best is ever left out)
and, with a model, the model's most promising usable neighbour of any of them.
Further base keys (``niches``: the best config of each knob value, so that a
basin other than the best one's is climbed once the best ones are exhausted)
come after the ``top`` best.
A base key found with no usable neighbour is never looked at again (keys only
ever become unusable).

Imports :mod:`tiletune.tuner.encoding` and :mod:`tiletune.tuner.surrogate` only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tiletune.tuner.encoding import Encoding, Key
from tiletune.tuner.surrogate import PairModel


class LocalSearch:
    """Neighbours of the best configs; see the module docstring for the contract."""

    def __init__(self, enc: Encoding, top: int) -> None:
        self._enc = enc
        self._top = top
        self._explored: set[Key] = set()
        self._turns = 0

    def propose(
        self,
        ranked: Sequence[tuple[float, int, Key]],
        usable: Callable[[Key], bool],
        model: PairModel | None,
        niches: Sequence[Key] = (),
    ) -> Key | None:
        """A usable neighbour of the best keys of ``ranked`` (``(time, order, key)``, fastest first).

        ``niches`` are further base keys, looked at after the ``top`` best.
        """
        self._turns += 1
        guided = model is not None and self._turns % 2 == 0
        fresh: dict[Key, None] = {}
        bases = dict.fromkeys([key for _, _, key in ranked[: self._top]] + list(niches))
        for base in bases:
            if base in self._explored:
                continue
            mine = [key for key in self._enc.neighbours(base) if usable(key)]
            if not mine:
                self._explored.add(base)
            elif not guided:
                return mine[0]
            fresh.update(dict.fromkeys(mine))
        if not fresh or model is None:
            return None
        return model.most_promising(list(fresh))
