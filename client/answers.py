"""The answers a client served itself (its caches, its defaults): counted on the launch path, reported
off it, into the server's ``tiletune_client_answers_total``.

Contract (:class:`AnswerTally`, thread-safe, no I/O: the clients send the reports):

- the launch path counts an answer with ``next(tally.counters[match])``: one call into C, which
  holds the GIL throughout (no count is lost between threads) and allocates nothing (each counter
  is an ``itertools.repeat`` of ``None``; how far it went is its length consumed). The counters
  are never reset: a report carries what was counted since the last report taken;
- ``take`` hands the counts since the last report over as one
  :class:`~tiletune.client.wire.ClientStatsCreate` (at most ``MAX_REPORTED_ANSWERS`` of a kind:
  the rest waits for the next report), or ``None`` when there is nothing new or reporting is off;
  it never raises (a chip the wire cannot carry turns reporting off, logged once);
- ``failed`` accounts for a report that failed: one worth retrying (no answer, 5xx, 408, 429,
  an answer that is not the API's, any other exception) gives its counts back for the next
  report; a 404 or 405 (a server older than ``POST /v1/client-stats``) turns reporting off
  for good, logged once; another refusal drops the counts, logged once per kind.
"""

from __future__ import annotations

import itertools
import logging
import operator
import sys
import threading
from collections.abc import Callable, Iterator

from tiletune.client import calls
from tiletune.client.calls import Call, ServerRefusedError
from tiletune.client.keys import kind_of
from tiletune.client.wire import (
    MATCH_KINDS,
    MAX_REPORTED_ANSWERS,
    AnswerCounts,
    ClientStatsCreate,
    ClientStatsPublic,
)

log = logging.getLogger("tiletune.client")

#: Logs a message once per kind (``ClientCore.warn_once``).
WarnOnce = Callable[..., None]

#: Seconds a stats report may take (it runs off the launch path).
STATS_REPORT_TIMEOUT_S = 5.0

#: The statuses of a server that has no ``POST /v1/client-stats`` (an older release).
NO_SUCH_ROUTE = (404, 405)

#: Answers one counter can count (it would take centuries of launches to use them up).
_CAPACITY = sys.maxsize


def stats_call(stats: ClientStatsCreate) -> Call[ClientStatsPublic]:
    """The report of the answers served since the last one."""
    return calls.report_client_stats(stats, STATS_REPORT_TIMEOUT_S)


class AnswerTally:
    """The answers one chip's client served itself, by match; see the module docstring."""

    def __init__(self, chip: str, warn_once: WarnOnce) -> None:
        self.chip = chip
        #: The launch path's counters, one per match (``next`` counts one answer).
        self.counters: dict[str, Iterator[None]] = {
            match: itertools.repeat(None, _CAPACITY) for match in MATCH_KINDS
        }
        #: False once the server showed it has no such report (or the chip cannot be sent).
        self.reporting = True
        self._reported = dict.fromkeys(MATCH_KINDS, 0)
        self._lock = threading.Lock()
        self._warn_once = warn_once

    def counted(self) -> dict[str, int]:
        """Every answer counted so far, by match."""
        return {match: _CAPACITY - operator.length_hint(counter) for match, counter in self.counters.items()}

    def take(self) -> ClientStatsCreate | None:
        """The answers counted since the last report (marked reported), or ``None``; never raises."""
        if not self.reporting:
            return None
        with self._lock:
            counted = self.counted()
            new = {m: min(counted[m] - self._reported[m], MAX_REPORTED_ANSWERS) for m in MATCH_KINDS}
            if not any(new.values()):
                return None
            try:
                stats = ClientStatsCreate(chip=self.chip, answers=AnswerCounts(**new))
            except ValueError as error:
                self.reporting = False
                self._warn_once(
                    ("stats", kind_of(error)), "tiletune client: answers not reported (%s)", error
                )
                return None
            for match, count in new.items():
                self._reported[match] += count
        return stats

    def failed(self, stats: ClientStatsCreate, error: Exception) -> None:
        """Account for a report that failed (see the module docstring)."""
        if isinstance(error, ServerRefusedError) and error.status < 500 and error.status not in (408, 429):
            if error.status in NO_SUCH_ROUTE:
                self.reporting = False
                self._warn_once(
                    ("stats", "no route"),
                    "tiletune server takes no client stats (%s); this client reports none",
                    error,
                )
            else:
                self._warn_once(
                    ("stats refused", error.status, error.code),
                    "tiletune server refused a client stats report (%s); its counts are dropped",
                    error,
                )
            return
        log.info("tiletune client: client stats report failed (%s); kept for the next one", error)
        with self._lock:
            for match, count in stats.answers.model_dump().items():
                self._reported[match] -= count
