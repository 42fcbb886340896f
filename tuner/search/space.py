"""What may be searched: the declared space and its valid configs.

Contract: :class:`SearchSpace` is the declaration (knobs with ordered values, a
constraint, seeds). :class:`ValidSet` answers for one space: the constraint's
verdict on a key (asked once per key, then cached: the constraint must be a
pure function), the valid keys in knob-product order when the product is at
most ``ENUMERATE_LIMIT`` (``keys``; ``None`` above it), and a random valid key
that a predicate accepts, drawn with the caller's ``random.Random`` (``None``
when there is none, or, above the limit, when ``MAX_BLIND_DRAWS`` draws found none).

Imports the standard library and :mod:`tiletune.tuner.search.encoding` only.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from tiletune.tuner.search.encoding import Config, Encoding, Key

#: Spaces whose knob product is at most this are enumerated once (valid set, model, exhaustion).
ENUMERATE_LIMIT = 100_000

#: Random draws from a product too large to enumerate before the space is declared exhausted.
MAX_BLIND_DRAWS = 20_000


@dataclass(frozen=True)
class SearchSpace:
    """What may be searched: knobs, a constraint and the configs to measure first.

    ``knobs`` maps each knob to its candidate values (ints, distinct, ordered:
    neighbouring values are adjacent). ``invalid_reason`` returns why a config
    must never be measured, or ``None`` when it is valid. ``seeds`` are
    measured first, in order (the kernel's default config; later the best
    configs of neighbouring shapes); invalid or repeated seeds are skipped.
    """

    knobs: Mapping[str, Sequence[int]]
    invalid_reason: Callable[[Config], str | None]
    seeds: Sequence[Config] = ()


class ValidSet:
    """The valid configs of one :class:`SearchSpace`; see the module docstring for the contract."""

    def __init__(self, space: SearchSpace, enc: Encoding) -> None:
        self._space = space
        self._enc = enc
        self._validity: dict[Key, str | None] = {}
        self.keys = self._enumerate()

    def reason(self, key: Key) -> str | None:
        """Why the config of ``key`` must never be measured, or ``None`` when it is valid."""
        if key not in self._validity:
            self._validity[key] = self._space.invalid_reason(self._enc.config(key))
        return self._validity[key]

    def is_valid(self, key: Key) -> bool:
        """True when the constraint accepts the config of ``key``."""
        return self.reason(key) is None

    def grid(self) -> Iterator[Key]:
        """Every valid key in knob-product order (lazily when the product is not enumerated)."""
        if self.keys is not None:
            return iter(self.keys)
        return (key for key in self._enc.all_keys() if self.is_valid(key))

    def random_key(self, rng: random.Random, accept: Callable[[Key], bool]) -> Key | None:
        """A uniformly random valid key that ``accept`` accepts (``None``: none found)."""
        if self.keys is None:
            return self._blind_key(rng, accept)
        for _ in range(64):
            key = rng.choice(self.keys)
            if accept(key):
                return key
        remaining = [key for key in self.keys if accept(key)]
        return rng.choice(remaining) if remaining else None

    def _blind_key(self, rng: random.Random, accept: Callable[[Key], bool]) -> Key | None:
        """Random draws from a product too large to enumerate."""
        for _ in range(MAX_BLIND_DRAWS):
            key = tuple(rng.randrange(size) for size in self._enc.sizes)
            if accept(key) and self.is_valid(key):
                return key
        return None

    def _enumerate(self) -> list[Key] | None:
        if self._enc.product_size > ENUMERATE_LIMIT:
            return None
        return [key for key in self._enc.all_keys() if self.is_valid(key)]
