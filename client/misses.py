"""Misses: the keys a client answered with ``nearest`` or ``default``, counted and reported in batches.

Contract (:class:`MissLedger`, thread-safe, no I/O: the clients send the reports):

- ``note`` counts a key's answer; at most ``MAX_PENDING_MISSES`` keys wait for a report (the
  oldest are dropped beyond); a key the server refuses is never counted again;
- ``take`` hands the counts over as one :class:`~tiletune.client.wire.MissesCreate` (and
  forgets them); a key the wire cannot carry is dropped, logged once: it never raises;
- ``failed`` accounts for a report that failed: a refusal naming one entry's key (422
  ``misses[i].kernel``, ``.shape...``, ``.dtype`` or the entry itself) drops that key for good
  and keeps the others (to be sent at once), so one key the server will not take never costs
  the others; one naming an entry's ``count`` or ``match`` drops that entry's counts only; one
  naming an entry's ``chip`` (every entry's) drops the report, no key remembered; a failure
  worth retrying keeps them all for the next report; another refusal drops them (401 or 403: no
  token, or one without the reader role, said once per client at WARNING with what to set).
"""

from __future__ import annotations

import logging
import re
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Literal

from tiletune.client import calls
from tiletune.client.calls import Call, ServerRefusedError
from tiletune.client.keys import kind_of
from tiletune.client.wire import MissesCreate, MissesPublic, MissReport

log = logging.getLogger("tiletune.client")

MissMatch = Literal["nearest", "default"]
MissKey = tuple[str, tuple[tuple[str, int], ...], str]
#: Logs a message once per kind (``ClientCore.warn_once``).
WarnOnce = Callable[..., None]

#: Seconds a miss report may take (it runs off the launch path).
MISS_REPORT_TIMEOUT_S = 5.0

#: Reports one flush sends at most (each after the server refused one key of the last).
MISS_REPORT_ATTEMPTS = 8

#: Keys with misses kept between reports at most (the oldest are dropped beyond).
MAX_PENDING_MISSES = 10_000

#: Keys the server refused in miss reports remembered at most (forgotten all at once beyond).
MAX_REFUSED_MISSES = 10_000

#: The statuses of a report refused for its token: none, unknown, or without the reader role.
UNAUTHORIZED = (401, 403)

#: The entry a server's 422 names in a miss report (``misses[3].shape.n``).
_MISS_FIELD = re.compile(r"misses\[(\d+)\]")


def misses_call(misses: MissesCreate) -> Call[MissesPublic]:
    """The report of a batch of misses."""
    return calls.report_misses(misses, MISS_REPORT_TIMEOUT_S)


class MissLedger:
    """The misses of one chip's client waiting for a report; see the module docstring."""

    def __init__(self, chip: str, warn_once: WarnOnce) -> None:
        self.chip = chip
        self.lock = threading.Lock()
        self._warn_once = warn_once
        self._misses: Counter[tuple[str, tuple[tuple[str, int], ...], str, MissMatch]] = Counter()
        self._refused: set[MissKey] = set()

    def note(self, match: str, kernel: str, shape: Mapping[str, int], dtype: str) -> None:
        """Count an answer of ``match`` to a (checked) key for the next report (``exact``: nothing)."""
        if match == "exact":
            return
        items = tuple(shape.items())
        with self.lock:
            if (kernel, items, dtype) in self._refused:
                return
            if len(self._misses) >= MAX_PENDING_MISSES:
                self._misses.pop(next(iter(self._misses)))
            kind: MissMatch = "nearest" if match == "nearest" else "default"
            self._misses[(kernel, items, dtype, kind)] += 1

    def take(self) -> MissesCreate | None:
        """The misses counted since the last report (and forget them), or ``None``.

        A counted key the wire cannot carry is dropped (logged once): a report never fails to build.
        """
        with self.lock:
            if not self._misses:
                return None
            pending, self._misses = self._misses, Counter()
        reports = []
        for (kernel, shape, dtype, match), count in pending.items():
            try:
                reports.append(
                    MissReport(
                        kernel=kernel,
                        shape=dict(shape),
                        dtype=dtype,
                        chip=self.chip,
                        match=match,
                        count=min(count, 1_000_000),
                    )
                )
            except ValueError as error:
                self._warn_once(("miss", kind_of(error)), "tiletune client: a miss not reported: %s", error)
        return MissesCreate(misses=reports) if reports else None

    def failed(self, misses: MissesCreate, error: Exception) -> bool:
        """Account for a report that failed.

        A refusal naming one entry (422 ``misses[i]...``: a kernel, shape or dtype the server
        does not take) drops that key for good (its ``count`` or ``match``: that entry's counts
        only) and keeps the others for the next report; one naming an entry's ``chip`` drops the
        report (every entry has that chip); another failure worth retrying (no answer, 5xx, 408,
        429, an answer that is not the API's, any other exception) keeps the misses for the next
        report; another refusal (4xx) drops them, logged: sending the same batch again would be
        refused again (a 401 or 403, the token's fault, is logged once per client, saying what to
        set). ``True`` when the others may be sent at once (an entry was dropped, others remain).
        """
        named = _MISS_FIELD.match(error.field or "") if isinstance(error, ServerRefusedError) else None
        if named is not None and int(named.group(1)) < len(misses.misses):
            assert isinstance(error, ServerRefusedError)
            refused = misses.misses[int(named.group(1))]
            part = (error.field or "")[named.end() :]
            if part.startswith(".chip"):
                self._warn_once(
                    ("miss chip refused", error.code),
                    "tiletune server refused this client's chip in a miss report (%s); %d keys dropped",
                    error,
                    len(misses.misses),
                )
                return False
            if not part.startswith((".count", ".match")):
                self._warn_once(
                    (
                        "miss refused",
                        refused.kernel,
                        error.code,
                        _MISS_FIELD.sub("misses[]", error.field or ""),
                    ),
                    "tiletune server refused the miss of %s %s %s (%s); such keys are not reported again",
                    refused.kernel,
                    refused.shape,
                    refused.dtype,
                    error,
                )
                self.refuse((refused.kernel, tuple(refused.shape.items()), refused.dtype))
            others = [miss for miss in misses.misses if miss is not refused]
            self._give_back(MissesCreate.model_construct(misses=others))
            return bool(others)
        if isinstance(error, ServerRefusedError) and error.status < 500 and error.status not in (408, 429):
            self._report_refused(misses, error)
            return False
        log.info("tiletune client: miss report failed (%s); kept for the next one", error)
        self._give_back(misses)
        return False

    def _report_refused(self, misses: MissesCreate, error: ServerRefusedError) -> None:
        """A refusal of the whole report (a 4xx naming no entry): its misses are dropped, logged; a
        401 or 403 (no token, or one without the reader role) once per client, saying what to set."""
        if error.status in UNAUTHORIZED:
            self._warn_once(
                ("miss report unauthorized",),
                "tiletune server refused a miss report (%s): set TILETUNE_TOKEN (read by "
                "tiletune.configure) or pass token= to configure() or ConfigClient(), a token with the "
                "reader role; until then this client's misses are dropped (%d keys now)",
                error,
                len(misses.misses),
            )
            return
        log.warning("tiletune server refused a miss report (%s); %d keys dropped", error, len(misses.misses))

    def refuse(self, key: tuple[str, tuple[tuple[str, int], ...], str]) -> None:
        """Never count ``key`` (kernel, shape items, dtype) as a miss again: the server refuses it."""
        with self.lock:
            if len(self._refused) >= MAX_REFUSED_MISSES:
                self._refused.clear()
            self._refused.add(key)

    def _give_back(self, misses: MissesCreate) -> None:
        """A report failed: count its misses again for the next one."""
        with self.lock:
            for miss in misses.misses:
                key = (miss.kernel, tuple(miss.shape.items()), miss.dtype, miss.match)
                self._misses[key] += miss.count
