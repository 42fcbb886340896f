"""The trials of a search: what it hands out, what it takes back, and which are outstanding.

- :class:`Candidate`: a config to measure and the id to tell its result under;
- :class:`PastTrial` (:data:`PastOutcome`): a trial an earlier search handed out and what
  became of it, from which a search resumes;
- :class:`Outstanding`: the trials handed out and not yet told or abandoned (by id, and
  their configs), the ids settled already, and the next id to hand out. Ids are the search's
  own, counted from 0; a resumed search continues after the largest past one.

Imports optuna's trial type, :mod:`tiletune.tuner.search.encoding` and the standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from optuna.trial import Trial

from tiletune.tuner.search.encoding import Config, Key


@dataclass(frozen=True)
class Candidate:
    """A config to measure, and the id to tell its result under."""

    trial_id: int
    config: Config


PastOutcome = Literal["measured", "failed", "outstanding", "abandoned"]


@dataclass(frozen=True)
class PastTrial:
    """A trial an earlier search handed out, and what became of it (see :mod:`tiletune.tuner.search.search`).

    ``time_ms`` is set for ``measured``; ``reason`` says why for ``failed`` and ``abandoned``.
    """

    trial_id: int
    config: Config
    outcome: PastOutcome
    time_ms: float | None = None
    reason: str | None = None


@dataclass(frozen=True)
class Handed:
    """An outstanding trial: its Optuna trial and its config's key."""

    trial: Trial
    key: Key


class Outstanding:
    """The trials a search handed out and was not yet told about (see the module docstring).

    A trial is outstanding from :meth:`add` until :meth:`settle` (told or abandoned); a settled
    id is never outstanding again.
    """

    def __init__(self) -> None:
        self._handed: dict[int, Handed] = {}
        self._keys: set[Key] = set()
        self._settled: set[int] = set()
        #: The id the next trial handed out gets.
        self.next_id = 0

    def __len__(self) -> int:
        return len(self._handed)

    def ids(self) -> list[int]:
        """The outstanding trials' ids, in the order they were handed out."""
        return list(self._handed)

    def holds(self, key: Key) -> bool:
        """True when an outstanding trial measures the config ``key``."""
        return key in self._keys

    def is_settled(self, trial_id: int) -> bool:
        """True when ``trial_id`` was told or abandoned."""
        return trial_id in self._settled

    def get(self, trial_id: int) -> Handed:
        """The outstanding trial ``trial_id``; ``ValueError`` when it is not outstanding."""
        handed = self._handed.get(trial_id)
        if handed is None:
            raise ValueError(f"trial_id: no outstanding trial {trial_id}")
        return handed

    def add(self, trial: Trial, key: Key, trial_id: int | None = None) -> int:
        """Hand out ``trial`` for ``key`` under ``trial_id`` (default: the next id); its id."""
        if trial_id is None:
            trial_id = self.next_id
        self.skip_past(trial_id)
        self._handed[trial_id] = Handed(trial, key)
        self._keys.add(key)
        return trial_id

    def settle(self, trial_id: int) -> Handed:
        """Take the outstanding trial ``trial_id`` back (told or abandoned); ``ValueError`` when it
        is not outstanding."""
        handed = self._handed.pop(trial_id, None)
        if handed is None:
            raise ValueError(f"trial_id: no outstanding trial {trial_id}")
        self._keys.discard(handed.key)
        self._settled.add(trial_id)
        return handed

    def settled_before(self, trial_id: int) -> None:
        """Record ``trial_id`` as settled by an earlier search (never outstanding here)."""
        self.skip_past(trial_id)
        self._settled.add(trial_id)

    def skip_past(self, trial_id: int) -> None:
        """Hand out ids after ``trial_id`` from now on."""
        self.next_id = max(self.next_id, trial_id + 1)
