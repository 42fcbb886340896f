"""The answers a client served itself (its caches, its defaults): counted on the launch path, reported
off it, into the server's ``tiletune_client_answers_total`` and its launches per key (what
re-tuning ranks stale keys by).

Contract (:class:`AnswerTally`, thread-safe, no I/O: the clients send the reports):

- each remembered answer has its own counter (:meth:`AnswerTally.counter`, kept beside the
  answer in ``ClientCore.memo``): the launch path counts a hit with ``next(counter)``, one call
  into C, which holds the GIL throughout (no count is lost between threads) and allocates
  nothing (a counter is an ``itertools.repeat`` of ``None``; how far it went is its length
  consumed). An answer with no key to remember (a bad key's default) is counted by match in
  ``counters``. Counters are never reset: a report gathers what each counted since the last;
- ``take`` gathers the counters and hands the counts since the last report over as one
  :class:`~tiletune.client.wire.ClientStatsCreate`: by match (at most ``MAX_REPORTED_ANSWERS``
  of a kind: the rest waits for the next report) and, in ``keys``, the launches of the
  ``MAX_REPORTED_KEYS`` most launched keys (the other keys' wait for the next report; at most
  ``MAX_PENDING_KEYS`` keys wait, the least launched are dropped beyond); ``None`` when there is
  nothing new or reporting is off. It never raises (a chip the wire cannot carry turns
  reporting off, logged once). The counter of an answer no longer remembered (expired,
  replaced, forgotten) is dropped once two gatherings in a row (reports, or a client with many
  more counters than answers) found it counting nothing: a launch that read an answer just
  before it was dropped and counts it only after that goes uncounted (the counts rank keys;
  they are not accounts);
- ``failed`` accounts for a report that failed: one worth retrying (no answer, 5xx, 408, 429,
  an answer that is not the API's, any other exception) gives its counts back for the next
  report; a 404 or 405 (a server older than ``POST /v1/client-stats``) turns reporting off
  for good, logged once; a 422 naming ``keys`` (a server older than per-key counts refuses the
  field) turns the per-key counts off for good, logged once, and gives the answers back to be
  sent again at once; another refusal drops the counts, logged once per kind.
"""

from __future__ import annotations

import itertools
import logging
import operator
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from tiletune.client import calls
from tiletune.client.calls import Call, ServerRefusedError
from tiletune.client.keys import kind_of
from tiletune.client.wire import (
    MATCH_KINDS,
    MAX_REPORTED_ANSWERS,
    MAX_REPORTED_KEYS,
    AnswerCounts,
    ClientStatsCreate,
    ClientStatsPublic,
    KeyLaunches,
)

log = logging.getLogger("tiletune.client")

#: Logs a message once per kind (``ClientCore.warn_once``).
WarnOnce = Callable[..., None]
#: A remembered answer's key, as ``ClientCore.memo`` keys it: (kernel, dtype, shape items).
AnswerKey = tuple[str, str, tuple[tuple[str, int], ...]]
#: The answers remembered, each with its counter (``ClientCore.memo``; read, never written, here).
Remembered = Mapping[AnswerKey, tuple[object, Iterator[None]]]

#: Seconds a stats report may take (it runs off the launch path).
STATS_REPORT_TIMEOUT_S = 5.0

#: Reports one flush sends at most (the second without per-key counts, after a server refused them).
STATS_REPORT_ATTEMPTS = 2

#: The statuses of a server that has no ``POST /v1/client-stats`` (an older release).
NO_SUCH_ROUTE = (404, 405)

#: Keys whose launches wait for a report at most (the least launched are dropped beyond).
MAX_PENDING_KEYS = 10_000

#: Counters kept beyond twice the answers remembered before the dropped ones are gathered early.
SPARE_COUNTERS = 1024

#: Answers one counter can count (it would take centuries of launches to use them up).
_CAPACITY = sys.maxsize


def stats_call(stats: ClientStatsCreate) -> Call[ClientStatsPublic]:
    """The report of the answers served since the last one."""
    return calls.report_client_stats(stats, STATS_REPORT_TIMEOUT_S)


def _consumed(counter: Iterator[None]) -> int:
    """How many answers ``counter`` counted."""
    return _CAPACITY - operator.length_hint(counter)


@dataclass(slots=True)
class _Slot:
    """The counter of one remembered answer and how much of it was gathered."""

    key: AnswerKey
    match: str
    counter: Iterator[None]
    gathered: int = 0
    #: Gatherings in a row that found it neither remembered nor counting (dropped at 2).
    idle: int = 0


class AnswerTally:
    """The answers one chip's client served itself, by match and by key; see the module docstring.

    ``remembered`` is the client's memo: a counter whose answer it no longer holds is dropped.
    """

    def __init__(self, chip: str, warn_once: WarnOnce, remembered: Remembered) -> None:
        self.chip = chip
        #: The counters of answers with no key remembered, one per match (``next`` counts one).
        self.counters: dict[str, Iterator[None]] = {
            match: itertools.repeat(None, _CAPACITY) for match in MATCH_KINDS
        }
        #: False once the server showed it has no such report (or the chip cannot be sent).
        self.reporting = True
        #: False once the server refused per-key counts (an older release): answers only.
        self.keyed = True
        self._remembered = remembered
        self._slots: list[_Slot] = []
        self._gathered = dict.fromkeys(MATCH_KINDS, 0)  # of ``counters``
        self._counted = dict.fromkeys(MATCH_KINDS, 0)  # every answer gathered
        self._pending = dict.fromkeys(MATCH_KINDS, 0)  # gathered, not reported yet
        self._pending_keys: Counter[AnswerKey] = Counter()
        self._lock = threading.Lock()
        self._warn_once = warn_once

    def counter(self, key: AnswerKey, match: str) -> Iterator[None]:
        """A new counter for the answer (of ``match``) about to be remembered for ``key``."""
        counter = itertools.repeat(None, _CAPACITY)
        with self._lock:
            if len(self._slots) > 2 * len(self._remembered) + SPARE_COUNTERS:
                self._gather()  # drops the counters of answers no longer remembered
            self._slots.append(_Slot(key, match, counter))
        return counter

    def counted(self) -> dict[str, int]:
        """Every answer counted so far, by match."""
        with self._lock:
            self._gather()
            return dict(self._counted)

    def _gather(self) -> None:
        """Move what every counter counted since the last gathering to the pending counts, and drop
        the counters found twice in a row neither remembered nor counting (twice: a counter just
        made is remembered only after). Under the lock."""
        for match, counter in self.counters.items():
            consumed = _consumed(counter)
            self._add(match, consumed - self._gathered[match])
            self._gathered[match] = consumed
        kept = []
        for slot in self._slots:
            consumed = _consumed(slot.counter)
            new, slot.gathered = consumed - slot.gathered, consumed
            if new:
                self._add(slot.match, new)
                if self.keyed:
                    self._pending_keys[slot.key] += new
            held = self._remembered.get(slot.key)
            slot.idle = 0 if new or (held is not None and held[1] is slot.counter) else slot.idle + 1
            if slot.idle < 2:
                kept.append(slot)
        self._slots = kept
        if len(self._pending_keys) > MAX_PENDING_KEYS:
            self._pending_keys = Counter(dict(self._pending_keys.most_common(MAX_PENDING_KEYS)))

    def _add(self, match: str, count: int) -> None:
        self._counted[match] += count
        self._pending[match] += count

    def take(self) -> ClientStatsCreate | None:
        """The answers counted since the last report (marked reported), or ``None``; never raises."""
        if not self.reporting:
            return None
        with self._lock:
            self._gather()
            answers = {match: min(self._pending[match], MAX_REPORTED_ANSWERS) for match in MATCH_KINDS}
            keys = self._top_keys() if self.keyed else []
            if not any(answers.values()) and not keys:
                return None
            try:
                stats = ClientStatsCreate(
                    chip=self.chip, answers=AnswerCounts(**answers), keys=[entry for _, entry in keys]
                )
            except ValueError as error:
                self.reporting = False
                self._warn_once(
                    ("stats", kind_of(error)), "tiletune client: answers not reported (%s)", error
                )
                return None
            for match, count in answers.items():
                self._pending[match] -= count
            for key, entry in keys:
                self._pending_keys[key] -= entry.count
                if self._pending_keys[key] <= 0:
                    del self._pending_keys[key]
        return stats

    def _top_keys(self) -> list[tuple[AnswerKey, KeyLaunches]]:
        """The most launched keys waiting for a report, as the wire carries them (a key it cannot
        carry is dropped). Under the lock."""
        top = []
        for key, count in self._pending_keys.most_common(MAX_REPORTED_KEYS):
            kernel, dtype, shape = key
            try:
                launches = min(count, MAX_REPORTED_ANSWERS)
                top.append((key, KeyLaunches(kernel=kernel, shape=dict(shape), dtype=dtype, count=launches)))
            except ValueError:
                del self._pending_keys[key]
        return top

    def failed(self, stats: ClientStatsCreate, error: Exception) -> bool:
        """Account for a report that failed (see the module docstring); ``True`` when its answers
        may be sent again at once (the server refused the per-key counts only)."""
        if isinstance(error, ServerRefusedError) and error.status < 500 and error.status not in (408, 429):
            if error.status in NO_SUCH_ROUTE:
                self.reporting = False
                self._warn_once(
                    ("stats", "no route"),
                    "tiletune server takes no client stats (%s); this client reports none",
                    error,
                )
            elif error.status == 422 and stats.keys and (error.field or "").startswith("keys"):
                self.keyed = False
                self._warn_once(
                    ("stats", "no keys"),
                    "tiletune server takes no launches per key (%s); this client reports answers only",
                    error,
                )
                self._give_back(stats)
                return True
            else:
                self._warn_once(
                    ("stats refused", error.status, error.code),
                    "tiletune server refused a client stats report (%s); its counts are dropped",
                    error,
                )
            return False
        log.info("tiletune client: client stats report failed (%s); kept for the next one", error)
        self._give_back(stats)
        return False

    def _give_back(self, stats: ClientStatsCreate) -> None:
        """Count a report's answers (and, while per-key counts are on, its keys) as not reported."""
        with self._lock:
            for match, count in stats.answers.model_dump().items():
                self._pending[match] += count
            if self.keyed:
                for entry in stats.keys:
                    self._pending_keys[(entry.kernel, entry.dtype, tuple(entry.shape.items()))] += entry.count
