"""What the read routes hold: the index of best configs, the export cache, shape parses, cached misses.

:meth:`Reads.lookup` is the single-key lookup as the route answers it: the key parsed (from the
cache of recent shape texts), then an exact hit served from the index as its pre-serialised
body, with no thread-pool hop, no ORM and no validation (counted per key in memory:
:class:`~tiletune.service.demand.key_usage.KeyUsage`, what re-tuning ranks stale keys by); anything else
(nearest, default, not found) through :func:`tiletune.service.lookup.lookup` in the thread pool,
its answer kept per index version (:class:`~tiletune.service.lookup.LookupCache`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fastapi.concurrency import run_in_threadpool

from tiletune.client.wire import MATCH_KINDS
from tiletune.service.database import Database
from tiletune.service.demand.key_usage import KeyUsage
from tiletune.service.entries import LOOKUP_BODY
from tiletune.service.errors import InvalidInputError, NotFoundError
from tiletune.service.exports import Exports
from tiletune.service.index import BestIndex
from tiletune.service.lookup import LookupCache, ShapeTexts, lookup
from tiletune.service.metrics import ServiceMetrics


@dataclass
class Reads:
    """The read side of one replica (``app.state.services.reads``)."""

    db: Database
    index: BestIndex
    exports: Exports
    shapes: ShapeTexts
    answers: LookupCache
    metrics: ServiceMetrics
    #: Exact lookups per key since the last flush (:meth:`KeyUsage.flush`).
    usage: KeyUsage = field(default_factory=KeyUsage)

    @classmethod
    def of(cls, db: Database, index_check_s: float, lookup_cache_s: float, metrics: ServiceMetrics) -> Reads:
        """The read side of ``db``: index checked every ``index_check_s``, misses kept ``lookup_cache_s``."""
        index = BestIndex(db, index_check_s)
        db.after_configs_change.append(index.refresh)  # the writer applies its change before it answers
        return cls(db, index, Exports(db, index), ShapeTexts(), LookupCache(lookup_cache_s), metrics)

    async def lookup(self, kernel: str, shape: str, *, dtype: str, chip: str, match: str) -> bytes:
        """The serialised ``LookupPublic`` of one key (see the module docstring)."""
        if match not in MATCH_KINDS:
            raise InvalidInputError(f"match must be one of {list(MATCH_KINDS)}, got {match!r}", field="match")
        key = self.shapes.parse(kernel, shape, dtype)
        snapshot = await self.index.current()
        indexed = (key.spec.name, key.spec.version, key.shape_key, dtype, chip)
        entry = snapshot.entries.find(indexed)
        if entry is not None:
            self.metrics.lookup("exact")
            self.usage.count(indexed)
            return entry[LOOKUP_BODY]
        asked = (kernel, shape, dtype, chip, match)
        cached = self.answers.get(asked, snapshot.version)
        if cached is None:
            try:
                answer = await run_in_threadpool(
                    lookup, self.db, kernel, shape, dtype=dtype, chip=chip, match=match
                )
            except NotFoundError:
                self.metrics.lookup("none")
                raise
            cached = (answer.match, answer.model_dump_json().encode())
            self.answers.put(asked, snapshot.version, cached)
        self.metrics.lookup(cached[0])
        return cached[1]
