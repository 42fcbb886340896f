"""Single-key config lookup: exact, else nearest tuned shape, else the kernel's default.

``match`` in a request is the loosest answer the caller accepts: ``exact``
answers only tuned keys (404 ``not_found`` otherwise), ``nearest`` also the
best config of the nearest tuned shape (same kernel version, dtype, chip and
categorical dims; distance in :mod:`tiletune.client.nearest`), ``default``
(the default) also the kernel's built-in rule for the chip. A nearest
shape's config is adapted to the asked shape (each knob snapped down to the
values this shape allows) and used only if it is valid for it.

An exact hit is answered by the route from the in-memory index (:mod:`tiletune.service.index`)
without this module's query; :func:`lookup` answers the rest (nearest, default, not found).
:class:`ShapeTexts` remembers the parse of recent shape texts, so a hit parses nothing.
:class:`LookupCache` keeps the serialised answers of misses for ``lookup_cache_s``, under the
index's version (moved by a promotion or an import in any replica, as the index sees it), so a
change drops them as soon as the index holds it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from tiletune.client import space
from tiletune.client.wire import MATCH_KINDS, LookupPublic, Match
from tiletune.kernels import Config, DeviceLimits, KernelDeclaration, Shape
from tiletune.service import configs
from tiletune.service.database import Database
from tiletune.service.errors import InvalidInputError, NotFoundError
from tiletune.service.fleet import chip_by_name, chip_limits
from tiletune.service.models import BestConfigRow
from tiletune.service.specs import chip_dependent, knob_values_of, parse_key
from tiletune.service.views import best_row_public

LookupKey = tuple[str, str, str, str, str]
#: (kernel name as asked, shape text, dtype): what :class:`ShapeTexts` remembers a parse by.
ShapeText = tuple[str, str, str]


@dataclass(frozen=True)
class ParsedKey:
    """A lookup's key as the index names it: the spec, the parsed shape and its canonical text."""

    spec: KernelDeclaration
    shape: Shape
    shape_key: str
    dtype: str


class ShapeTexts:
    """The parses of recent (kernel, shape text, dtype) triples; at most ``max_entries`` (emptied when full).

    Only valid keys are kept: an invalid one is parsed (and refused) again each time.
    """

    def __init__(self, max_entries: int = 100_000) -> None:
        self.max_entries = max_entries
        self._parsed: dict[ShapeText, ParsedKey] = {}

    def parse(self, kernel: str, shape_text: str, dtype: str) -> ParsedKey:
        """The key; :class:`InvalidInputError` naming the field when it is not one."""
        found = self._parsed.get((kernel, shape_text, dtype))
        if found is not None:
            return found
        spec, shape = parse_key(kernel, shape_text, dtype)
        parsed = ParsedKey(spec, shape, spec.canonical_shape(shape), dtype)
        if len(self._parsed) >= self.max_entries:
            self._parsed.clear()
        self._parsed[(kernel, shape_text, dtype)] = parsed
        return parsed


#: A cached answer: its kind (``nearest``, ``default``) and its serialised body.
CachedAnswer = tuple[str, bytes]


class LookupCache:
    """Recent serialised answers by (kernel, shape text, dtype, chip, match), for ``ttl_s`` seconds.

    Entries are dropped when the ``generation`` they were stored under moves (the index's
    version) or their TTL passes; at most ``max_entries`` are kept (the whole cache is
    emptied when full). ``ttl_s`` 0 disables it.
    """

    def __init__(self, ttl_s: float, max_entries: int = 100_000, clock: Callable[[], float] = time.monotonic):
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._clock = clock
        self._entries: dict[LookupKey, tuple[float, int, CachedAnswer]] = {}
        self._lock = threading.Lock()

    def get(self, key: LookupKey, generation: int) -> CachedAnswer | None:
        """The cached answer, if fresh."""
        found = self._entries.get(key)
        if found is None or found[1] != generation or found[0] < self._clock():
            return None
        return found[2]

    def put(self, key: LookupKey, generation: int, answer: CachedAnswer) -> None:
        """Keep ``answer`` for ``ttl_s``."""
        if self.ttl_s <= 0:
            return
        with self._lock:
            if len(self._entries) >= self.max_entries:
                self._entries.clear()
            self._entries[key] = (self._clock() + self.ttl_s, generation, answer)


def lookup(db: Database, kernel: str, shape_text: str, *, dtype: str, chip: str, match: str) -> LookupPublic:
    """The config for one key, as loose as ``match`` allows; see the module docstring."""
    if match not in MATCH_KINDS:
        raise InvalidInputError(f"match must be one of {list(MATCH_KINDS)}, got {match!r}", field="match")
    spec, shape = parse_key(kernel, shape_text, dtype)
    allowed = MATCH_KINDS[: MATCH_KINDS.index(match) + 1]
    with db.read() as session:
        exact = configs.exact_public(session, spec, spec.canonical_shape(shape), dtype, chip)
        if exact is not None:  # the common case, in one query (two where the chip sets the values)
            found = chip_by_name(session, chip) if chip_dependent(spec) else None
            return LookupPublic(
                kernel=spec.name,
                shape=shape,
                dtype=dtype,
                chip=chip,
                config=exact.config,
                match="exact",
                best=exact,
                knob_values=knob_values_of(spec, shape, chip_limits(found) if found is not None else None),
            )
        chip_row = chip_by_name(session, chip)
        if chip_row is None:
            raise NotFoundError(f"no chip {chip!r} is registered", field="chip")
        limits = chip_limits(chip_row)

        def answer(config: Config, found: Match, best: BestConfigRow | None) -> LookupPublic:
            public = best_row_public(session, best) if best is not None else None
            return LookupPublic(
                kernel=spec.name,
                shape=shape,
                dtype=dtype,
                chip=chip,
                config=config,
                match=found,
                best=public,
                knob_values=knob_values_of(spec, shape, limits),
            )

        if "nearest" in allowed:
            for _, row in configs.nearest_best(session, spec, shape, dtype=dtype, chip_id=chip_row.id, k=5):
                config = adapt(spec, row.config, shape, dtype, limits)
                if config is not None:
                    return answer(config, "nearest", row)
        if "default" in allowed:
            return answer(spec.default_config(shape, dtype, limits), "default", None)
    raise NotFoundError(
        f"no config tuned for {spec.name} {spec.canonical_shape(shape)} {dtype} on {chip}", field="shape"
    )


def adapt(
    spec: KernelDeclaration, config: Config, shape: Shape, dtype: str, limits: DeviceLimits
) -> Config | None:
    """``config`` with each knob snapped down to the values ``shape`` allows; ``None`` if then invalid."""
    adapted = space.adapt(config, spec.knob_values(shape, limits))
    if adapted is None:
        return None
    return adapted if spec.invalid_reason(adapted, shape, dtype, limits) is None else None
