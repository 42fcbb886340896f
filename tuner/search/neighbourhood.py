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

Two options (:class:`~tiletune.tuner.search.strategy.TpeOptions`, ``local_optima`` and
``local_pairs``) change which keys are looked at:

- ``optima``: the bases are the best measured keys that no measured one-knob
  neighbour beats (local optima of what was measured), not the best keys overall. A flat
  basin of near-equal configs then counts as one base, not eight, and the other
  basins are climbed too. :meth:`LocalSearch.learn` must be told every success.
- ``pairs``: once the best key's one-knob neighbourhood is exhausted (it is a local
  optimum of one-knob moves), the model's turns also look at its two-knob neighbours: a
  better config two knobs away is found without a slower config in between.

Imports :mod:`tiletune.tuner.search.encoding` and :mod:`tiletune.tuner.search.surrogate` only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from tiletune.tuner.search.encoding import Encoding, Key
from tiletune.tuner.search.surrogate import PairModel


class LocalSearch:
    """Neighbours of the best configs; see the module docstring for the contract."""

    def __init__(self, enc: Encoding, top: int, *, optima: bool = False, pairs: bool = False) -> None:
        self._enc = enc
        self._top = top
        self._optima = optima
        self._pairs = pairs
        self._explored: set[Key] = set()
        self._turns = 0
        self._beaten: set[Key] = set()
        self._pair_pool: tuple[Key, list[Key]] | None = None

    def learn(self, key: Key, outcomes: Mapping[Key, float | str]) -> None:
        """Take a success of ``outcomes`` (the search's record: times, or errors of failures).

        ``key`` is beaten when a measured one-knob neighbour is faster; a slower one is beaten by it.
        """
        time_ms = outcomes[key]
        if not self._optima or isinstance(time_ms, str):
            return
        for near in self._enc.neighbours(key):
            other = outcomes.get(near)
            if other is None or isinstance(other, str):
                continue
            if other < time_ms:
                self._beaten.add(key)
            elif time_ms < other:
                self._beaten.add(near)

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
        for base in dict.fromkeys([*self._bases(ranked), *niches]):
            if base in self._explored:
                continue
            mine = [key for key in self._enc.neighbours(base) if usable(key)]
            if not mine:
                self._explored.add(base)
            elif not guided:
                return mine[0]
            fresh.update(dict.fromkeys(mine))
        if guided and self._pairs and ranked and ranked[0][2] in self._explored:
            fresh.update(dict.fromkeys(key for key in self._pair_neighbours(ranked[0][2]) if usable(key)))
        if not fresh or model is None:
            return None
        return model.most_promising(list(fresh))

    def _bases(self, ranked: Sequence[tuple[float, int, Key]]) -> list[Key]:
        """The ``top`` keys to climb from: the best ones, or with ``optima`` the best unbeaten ones."""
        if not self._optima:
            return [key for _, _, key in ranked[: self._top]]
        bases: list[Key] = []
        for _, _, key in ranked:
            if key not in self._beaten and key not in self._explored:
                bases.append(key)
                if len(bases) == self._top:
                    break
        return bases

    def _pair_neighbours(self, key: Key) -> list[Key]:
        """Keys that differ from ``key`` in exactly two knobs (kept for the last key asked)."""
        if self._pair_pool is None or self._pair_pool[0] != key:
            self._pair_pool = (key, list(self._enc.pair_neighbours(key)))
        return self._pair_pool[1]
