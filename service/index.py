"""The replica's in-memory index of best configs: exact lookups and exports without the ORM.

:class:`BestIndex` holds every best config of the store (all chips, kernels and versions) as an
immutable :class:`Snapshot`, keyed the way a lookup canonicalises a key: (kernel name, kernel
version, canonical shape, dtype, chip name). Each :class:`Entry` keeps its
``BestConfigPublic`` and, serialised when the entry is made (in a refresh, off the event loop),
the ``LookupPublic`` body of an exact hit, so a hit is one dict lookup and a send.

**Currency.** The index follows the ``promotions`` table, which every change of a best config
appends to (a promotion or an import, in any replica): a refresh reads the promotions after the
last one it applied (one indexed query, ``id > last``), then re-reads the best rows of the keys
they name. Incremental rather than rebuilt, because a running fleet promotes every few seconds
and a full reload of 10,000 rows costs a second of a core; a full reload is done on the first
refresh, when a refresh names more than :data:`FULL_RELOAD_KEYS` keys (a large import), and
every :data:`FULL_RELOAD_S` as a backstop.

- This replica's changes are seen at once: :meth:`BestIndex.current` refreshes before it
  answers whenever ``Database.generation`` (moved after each such commit here) differs from
  the snapshot's.
- Other replicas' changes are found by the check every ``check_s`` (``Settings.index_check_s``,
  0.5 s by default), run by :meth:`BestIndex.watch` in a background thread while the app
  serves; a request finding the last check older than ``2 * check_s`` (no watcher running)
  refreshes itself. So **an answer of this replica reflects every change committed by another
  replica more than ``2 * check_s`` (plus one refresh, milliseconds) before it**. One caveat on
  PostgreSQL: ids are drawn before commit, so a promotion may become visible after a later
  one; the ids skipped over are re-asked for at every check for :data:`GAP_S`, and the
  periodic full reload catches anything later still.
- Refreshes are serialised (a lock) and shared by the requests awaiting them
  (:class:`~tiletune.service.singleflight.SingleFlight`): many requests finding the index
  stale at once cost one refresh, run in the thread pool, never on the event loop.
- A refresh that fails (the database away) leaves the last snapshot serving; requests retry
  it at most once per ``check_s``. With no snapshot yet, the error is the request's.

``Snapshot.version`` moves whenever the entries change, from whichever replica: the export
cache (:mod:`tiletune.service.exports`) and the cache of answers that missed the index key
their entries by it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from sqlalchemy import func, or_, select, tuple_
from sqlalchemy.orm import Session

from tiletune.client.wire import BestConfigPublic, LookupPublic
from tiletune.kernels import DeviceLimits, Shape, all_declarations
from tiletune.service.database import Database
from tiletune.service.fleet import chip_limits
from tiletune.service.models import BestConfigRow, ChipRow, PromotionRow, SoftwareRow
from tiletune.service.singleflight import SingleFlight
from tiletune.service.specs import knob_values_of
from tiletune.service.views import best_public

log = logging.getLogger(__name__)

#: (kernel, kernel version, canonical shape, dtype, chip name): how the index keys a best config.
EntryKey = tuple[str, int, str, str, str]
#: A key as the promotions table names it (the chip by id).
_PromotedKey = tuple[str, int, str, str, int]

#: A refresh naming more keys than this reloads everything (cheaper than a huge ``IN``).
FULL_RELOAD_KEYS = 2_000
#: Seconds between full reloads (the backstop for promotions committed out of id order).
FULL_RELOAD_S = 300.0
#: Seconds a skipped promotion id is asked for again (PostgreSQL may commit it late).
GAP_S = 60.0
#: Skipped ids remembered at most (beyond, the full reload is the backstop).
MAX_GAPS = 10_000


class Entry:
    """One best config: its public document, its canonical JSON, and its exact-hit body.

    All three are serialised when the entry is made (in the index's refresh, off the event
    loop), so an exact hit only looks the body up.
    """

    __slots__ = ("best", "canonical", "lookup_body", "wire")

    def __init__(self, best: BestConfigPublic, limits: DeviceLimits) -> None:
        self.best = best
        #: The entry as the export serialises it.
        self.wire = best.model_dump_json().encode()
        #: The entry as ``ConfigBundle.content_checksum`` hashes it (sorted keys, no spaces).
        self.canonical = json.dumps(
            best.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), allow_nan=False
        )
        #: The ``LookupPublic`` of an exact hit (every shape text of this key names this shape).
        self.lookup_body = (
            LookupPublic(
                kernel=best.kernel,
                shape=best.shape,
                dtype=best.dtype,
                chip=best.chip,
                config=best.config,
                match="exact",
                best=best,
                knob_values=_knob_values(best.kernel, best.shape, limits),
            )
            .model_dump_json()
            .encode()
        )


@dataclass(frozen=True)
class Snapshot:
    """The index at one moment: never changed once made (a refresh makes a new one)."""

    entries: Mapping[EntryKey, Entry]
    #: The entries of each chip, by key (what an export reads).
    by_chip: Mapping[str, Mapping[EntryKey, Entry]]
    #: Moves whenever the entries change (from any replica).
    version: int
    #: The ``version`` at which each chip's entries last changed (what an export is cached by).
    chip_versions: Mapping[str, int]
    #: ``Database.generation`` read before the refresh that made this snapshot.
    generation: int


@dataclass
class _Cursor:
    """How far the index has read the promotions table."""

    last_id: int = 0
    gaps: dict[int, float] = field(default_factory=dict)  # skipped id -> when first skipped
    reloaded_at: float = float("-inf")


class BestIndex:
    """Every best config of the store, kept current; see the module docstring."""

    def __init__(self, db: Database, check_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.db = db
        self.check_s = check_s
        self._clock = clock
        self._snapshot: Snapshot | None = None
        self._checked_at = float("-inf")
        self._retry_at = float("-inf")
        self._cursor = _Cursor()
        self._lock = threading.Lock()
        self._flights: SingleFlight[Snapshot] = SingleFlight()
        #: Refreshes that changed the entries, and full reloads (for tests and logs).
        self.changes = 0
        self.reloads = 0

    @property
    def snapshot(self) -> Snapshot | None:
        """The last snapshot made (``None`` before the first refresh); :meth:`current` keeps it current."""
        return self._snapshot

    # -- the request path ------------------------------------------------------------------------

    def _fresh(self, snapshot: Snapshot | None) -> bool:
        if snapshot is None:
            return False
        now = self._clock()
        if now < self._retry_at:  # the last refresh failed: serve what we have until the retry
            return True
        return snapshot.generation == self.db.generation and now - self._checked_at < 2 * self.check_s

    async def current(self) -> Snapshot:
        """A snapshot holding this replica's every committed change (see the module docstring)."""
        snapshot = self._snapshot
        if self._fresh(snapshot):
            assert snapshot is not None
            return snapshot
        refreshed = await self._flights.run("refresh", self._refresh_or_keep)
        for _ in range(2):  # a change committed while a shared refresh ran needs one more
            if self._fresh(refreshed):
                break
            refreshed = await self._flights.run("refresh", self._refresh_or_keep)
        return refreshed

    def _refresh_or_keep(self) -> Snapshot:
        try:
            return self.refresh()
        except Exception:
            if self._snapshot is None:
                raise
            log.exception("refreshing the index of best configs failed; serving the last one")
            self._retry_at = self._clock() + self.check_s
            return self._snapshot

    # -- refreshing ------------------------------------------------------------------------------

    def refresh(self) -> Snapshot:
        """Apply every promotion committed since the last refresh (blocking: a thread's work)."""
        with self._lock:
            generation = self.db.generation
            started = self._clock()
            with self.db.read() as session:
                snapshot = self._read(session, generation, started)
            self._snapshot = snapshot
            self._checked_at = started
            self._retry_at = float("-inf")
            return snapshot

    def _read(self, session: Session, generation: int, now: float) -> Snapshot:
        old = self._snapshot
        cursor = self._cursor
        if old is None or now - cursor.reloaded_at >= FULL_RELOAD_S:
            return self._reload(session, generation, now)
        for gap, since in list(cursor.gaps.items()):
            if now - since > GAP_S:
                del cursor.gaps[gap]
        condition = PromotionRow.id > cursor.last_id
        if cursor.gaps:
            condition = or_(condition, PromotionRow.id.in_(list(cursor.gaps)))
        promoted = session.execute(
            select(
                PromotionRow.id,
                PromotionRow.kernel,
                PromotionRow.kernel_version,
                PromotionRow.shape_key,
                PromotionRow.dtype,
                PromotionRow.chip_id,
            ).where(condition)
        ).all()
        if not promoted:
            return Snapshot(old.entries, old.by_chip, old.version, old.chip_versions, generation)
        keys = {(row.kernel, row.kernel_version, row.shape_key, row.dtype, row.chip_id) for row in promoted}
        if len(keys) > FULL_RELOAD_KEYS:
            return self._reload(session, generation, now)
        changed = {key: Entry(best, limits) for key, best, limits in _best_entries(session, keys)}
        self._advance(cursor, [row.id for row in promoted], now)
        entries = {**old.entries, **changed}
        by_chip = dict(old.by_chip)
        chips = {key[4] for key in changed}
        for chip in chips:
            by_chip[chip] = {**by_chip.get(chip, {}), **{k: v for k, v in changed.items() if k[4] == chip}}
        version = old.version + 1
        chip_versions = {**old.chip_versions, **dict.fromkeys(chips, version)}
        self.changes += 1
        return Snapshot(entries, by_chip, version, chip_versions, generation)

    def _reload(self, session: Session, generation: int, now: float) -> Snapshot:
        last_id = session.scalar(select(func.max(PromotionRow.id))) or 0  # before the rows: none missed
        entries = {key: Entry(best, limits) for key, best, limits in _best_entries(session, None)}
        by_chip: dict[str, dict[EntryKey, Entry]] = {}
        for key, entry in entries.items():
            by_chip.setdefault(key[4], {})[key] = entry
        self._cursor = _Cursor(last_id=last_id, reloaded_at=now)
        self.reloads += 1
        old = self._snapshot
        version = old.version + 1 if old is not None else 1
        return Snapshot(entries, by_chip, version, dict.fromkeys(by_chip, version), generation)

    @staticmethod
    def _advance(cursor: _Cursor, ids: Iterable[int], now: float) -> None:
        seen = set(ids)
        for found in seen:
            cursor.gaps.pop(found, None)
        top = max(seen)
        if top > cursor.last_id:
            skipped = set(range(cursor.last_id + 1, top)) - seen
            if len(cursor.gaps) + len(skipped) <= MAX_GAPS:
                cursor.gaps.update(dict.fromkeys(skipped, now))
            cursor.last_id = top

    # -- the background check --------------------------------------------------------------------

    def watch(self, stop: threading.Event) -> None:
        """Refresh every ``check_s`` until ``stop`` is set (a thread's loop; errors are logged)."""
        while not stop.wait(self.check_s):
            try:
                self.refresh()
            except Exception:
                log.exception("checking the best configs for changes failed; trying again")


def _best_entries(
    session: Session, keys: set[_PromotedKey] | None
) -> Iterable[tuple[EntryKey, BestConfigPublic, DeviceLimits]]:
    """The best configs of ``keys`` (all when ``None``) as public documents with their chips'
    limits, in one query."""
    query = (
        select(BestConfigRow, ChipRow, SoftwareRow.fingerprint)
        .join(ChipRow, ChipRow.id == BestConfigRow.chip_id)
        .outerjoin(SoftwareRow, SoftwareRow.id == BestConfigRow.software_id)
    )
    if keys is not None:
        columns = (
            BestConfigRow.kernel,
            BestConfigRow.kernel_version,
            BestConfigRow.shape_key,
            BestConfigRow.dtype,
            BestConfigRow.chip_id,
        )
        query = query.where(tuple_(*columns).in_(sorted(keys)))
    fingerprints: dict[str | None, dict[str, str | None]] = {None: {}}
    for best, chip, text in session.execute(query):
        if text not in fingerprints:
            fingerprints[text] = json.loads(text) if text else {}
        key = (best.kernel, best.kernel_version, best.shape_key, best.dtype, chip.name)
        yield key, best_public(best, chip.name, fingerprints[text]), chip_limits(chip)


def _knob_values(kernel: str, shape: Shape, limits: DeviceLimits) -> dict[str, list[int]] | None:
    """The knob values a lookup answer carries on a chip of ``limits``, or none when the kernel is
    not installed here."""
    spec = all_declarations().get(kernel)
    return knob_values_of(spec, shape, limits) if spec is not None else None
