"""Warm starts: seeds for a new chip from the best configs of the same kernel on other chips.

The same kernel on another chip has its best region elsewhere, but rarely
everywhere else: the best configs of a few other chips are cheap first guesses
that local search then climbs from. The search measures seeds first, in order,
and skips invalid or repeated ones (:class:`~tiletune.tuner.search.search.SearchSpace`).

Contract: :func:`interleave_seeds` takes, per other chip, its configs fastest
first, and returns at most ``per_chip`` of each, interleaved round-robin (every
chip's best, then every chip's second best, ...), without repeats, chips in the
order given. It never reads times and never checks validity (the search does).

Imports the standard library and :mod:`tiletune.tuner.search.encoding` only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tiletune.tuner.search.encoding import Config


def interleave_seeds(best_by_chip: Mapping[str, Sequence[Mapping[str, int]]], per_chip: int) -> list[Config]:
    """Up to ``per_chip`` best configs of each chip, round-robin, first occurrence kept."""
    if per_chip < 0:
        raise ValueError(f"per_chip: must be at least 0, got {per_chip}")
    seeds: list[Config] = []
    seen: set[tuple[tuple[str, int], ...]] = set()
    for rank in range(per_chip):
        for configs in best_by_chip.values():
            if rank >= len(configs):
                continue
            config = dict(configs[rank])
            signature = tuple(sorted(config.items()))
            if signature not in seen:
                seen.add(signature)
                seeds.append(config)
    return seeds
