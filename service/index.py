"""The replica's in-memory index of best configs: exact lookups and exports without the ORM.

:class:`BestIndex` holds every best config of the store (all chips, kernels and versions) as an
immutable :class:`Snapshot`, keyed the way a lookup canonicalises a key: (kernel name, kernel
version, canonical shape, dtype, chip name). Each entry (:mod:`tiletune.service.entries`) keeps,
serialised when it is made (in a refresh, off the event loop), its ``BestConfigPublic`` and the
``LookupPublic`` body of an exact hit, so a hit is one dict lookup and a send; entries are plain
tuples the garbage collector never scans, in a map a change copies one shard of.

**Currency.** The index follows the ``promotions`` table, which every change of a best config
appends to (a promotion or an import, in any replica): a refresh reads the promotions after the
last one it applied (one indexed query, ``id > last``), then re-reads the best rows of the keys
they name (one query from the promotions to the best rows, whatever their number). Incremental
rather than rebuilt, because a running fleet promotes every few seconds and a full reload costs
a second of a core per 10,000 rows: an import's refresh costs its own size, not the store's, and
no refresh but the first reloads the store.

- This replica's changes are seen at once: the transaction that made one refreshes the index
  in its own thread before its request is answered (``Database.after_configs_change``), so
  lookups never wait for an import's or a promotion's refresh; one that overlaps it is
  concurrent with the write and may be answered from the snapshot before it. When no refresh
  is running, :meth:`BestIndex.current` refreshes before it answers whenever
  ``Database.generation`` (moved after each such commit here) differs from the snapshot's (the
  writer's refresh failed, or another ``Database`` wrote).
- Other replicas' changes are found by the check every ``check_s`` (``Settings.index_check_s``,
  0.5 s by default), run by :meth:`BestIndex.watch` in a background thread while the app
  serves; a request finding the last check older than ``2 * check_s`` (no watcher running)
  refreshes itself. So **an answer of this replica reflects every change committed by another
  replica more than ``2 * check_s`` (plus one refresh, milliseconds) before it**. One caveat on
  PostgreSQL: ids are drawn before commit, so a promotion may become visible after a later
  one; the ids skipped over are asked for at every check for :data:`GAP_S`, then every
  :data:`BACKSTOP_S` until :data:`LATE_S` (an hour: no transaction of the service lasts that
  long; a restart reloads everything).
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

from sqlalchemy import ColumnElement, and_, func, or_, select
from sqlalchemy.orm import Session

from tiletune.client.wire import BestConfigPublic
from tiletune.kernels import DeviceLimits
from tiletune.service.database import Database
from tiletune.service.entries import Entries, Entry, EntryKey, make_entry
from tiletune.service.fleet import chip_limits
from tiletune.service.models import BestConfigRow, ChipRow, PromotionRow, SoftwareRow
from tiletune.service.singleflight import SingleFlight
from tiletune.service.views import best_public

log = logging.getLogger(__name__)

#: Seconds a skipped promotion id is asked for at every check (PostgreSQL may commit it late).
GAP_S = 60.0
#: Seconds between the backstop's asks for the ids skipped longer ago than :data:`GAP_S`.
BACKSTOP_S = 300.0
#: Seconds after which a skipped id is forgotten (a rolled-back transaction's id never appears).
LATE_S = 3600.0
#: Skipped ids remembered at most (beyond, the full reload is the backstop).
MAX_GAPS = 10_000


@dataclass(frozen=True)
class Snapshot:
    """The index at one moment: never changed once made (a refresh makes a new one)."""

    entries: Entries
    #: The entries of each chip, by key (what an export reads).
    by_chip: Mapping[str, Entries]
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
    backstop_at: float = float("-inf")  # when skipped ids older than GAP_S were last asked for


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
        #: Refreshes run, those that changed the entries, and full reloads (for tests and logs).
        self.refreshes = 0
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
        if now - self._checked_at >= 2 * self.check_s:
            return False
        return snapshot.generation == self.db.generation or self._lock.locked()

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
            self.refreshes += 1
            self._checked_at = started
            self._retry_at = float("-inf")
            return snapshot

    def _read(self, session: Session, generation: int, now: float) -> Snapshot:
        old = self._snapshot
        cursor = self._cursor
        if old is None:
            return self._reload(session, generation, now)
        condition = PromotionRow.id > cursor.last_id
        asked = self._gaps_to_ask(cursor, now)
        if asked:
            condition = or_(condition, PromotionRow.id.in_(asked))
        promoted = session.scalars(select(PromotionRow.id).where(condition)).all()
        if not promoted:
            return Snapshot(old.entries, old.by_chip, old.version, old.chip_versions, generation)
        changed = {key: make_entry(best, limits) for key, best, limits in _best_entries(session, condition)}
        self._advance(cursor, promoted, now)
        by_chip = dict(old.by_chip)
        chips = {key[4] for key in changed}
        for chip in chips:
            ours = {key: entry for key, entry in changed.items() if key[4] == chip}
            by_chip[chip] = by_chip.get(chip, Entries()).changed(ours)
        version = old.version + 1
        chip_versions = {**old.chip_versions, **dict.fromkeys(chips, version)}
        self.changes += 1
        return Snapshot(old.entries.changed(changed), by_chip, version, chip_versions, generation)

    def _reload(self, session: Session, generation: int, now: float) -> Snapshot:
        last_id = session.scalar(select(func.max(PromotionRow.id))) or 0  # before the rows: none missed
        entries = {key: make_entry(best, limits) for key, best, limits in _best_entries(session, None)}
        chips: dict[str, dict[EntryKey, Entry]] = {}
        for key, entry in entries.items():
            chips.setdefault(key[4], {})[key] = entry
        by_chip = {chip: Entries().changed(held) for chip, held in chips.items()}
        self._cursor = _Cursor(last_id=last_id, backstop_at=now)
        self.reloads += 1
        old = self._snapshot
        version = old.version + 1 if old is not None else 1
        return Snapshot(
            Entries().changed(entries), by_chip, version, dict.fromkeys(by_chip, version), generation
        )

    @staticmethod
    def _gaps_to_ask(cursor: _Cursor, now: float) -> list[int]:
        """The skipped ids to ask for now: those skipped within :data:`GAP_S` at every check, all of
        them every :data:`BACKSTOP_S`; an id skipped longer than :data:`LATE_S` ago is forgotten."""
        for gap, since in list(cursor.gaps.items()):
            if now - since > LATE_S:
                del cursor.gaps[gap]
        if now - cursor.backstop_at >= BACKSTOP_S:
            cursor.backstop_at = now
            return list(cursor.gaps)
        return [gap for gap, since in cursor.gaps.items() if now - since <= GAP_S]

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
    session: Session, promoted: ColumnElement[bool] | None
) -> Iterable[tuple[EntryKey, BestConfigPublic, DeviceLimits]]:
    """The best configs of the keys of the promotions matching ``promoted`` (all when ``None``) as
    public documents with their chips' limits, in one query (from the promotions, by their ids:
    the store's size is not read)."""
    query = (
        select(BestConfigRow, ChipRow, SoftwareRow.fingerprint)
        .join(ChipRow, ChipRow.id == BestConfigRow.chip_id)
        .outerjoin(SoftwareRow, SoftwareRow.id == BestConfigRow.software_id)
    )
    if promoted is not None:
        named = (
            select(
                PromotionRow.kernel,
                PromotionRow.kernel_version,
                PromotionRow.shape_key,
                PromotionRow.dtype,
                PromotionRow.chip_id,
            )
            .where(promoted)
            .distinct()
            .subquery()
        )
        query = query.join(
            named,
            and_(
                BestConfigRow.kernel == named.c.kernel,
                BestConfigRow.kernel_version == named.c.kernel_version,
                BestConfigRow.shape_key == named.c.shape_key,
                BestConfigRow.dtype == named.c.dtype,
                BestConfigRow.chip_id == named.c.chip_id,
            ),
        )
    fingerprints: dict[str | None, dict[str, str | None]] = {None: {}}
    for best, chip, text in session.execute(query):
        if text not in fingerprints:
            fingerprints[text] = json.loads(text) if text else {}
        key = (best.kernel, best.kernel_version, best.shape_key, best.dtype, chip.name)
        yield key, best_public(best, chip.name, fingerprints[text]), chip_limits(chip)
