"""Fail points: named seams where a test makes this server process crash or fail, on purpose.

``TILETUNE_FAILPOINTS`` (read once, when first needed) lists ``point=action`` pairs, comma
separated. ``point`` is a seam's name, optionally qualified (``ask.start:7``: only for job 7);
``action`` is ``kill`` (SIGKILL this process: a crash at exactly that seam, no clean-up) or
``error`` (raise :class:`FailPointError`: the request answers 500), optionally ``@N``: act
at the N-th time the point is reached, not before (``tell.searched=kill@20``). Unset, as in
production, :func:`reach` costs a set lookup. The seams:

- ``reap.committed``: the reaper committed the end of expired leases, before their trials
  are abandoned;
- ``tell.searched``: a tell's outcomes are in the job's search in memory, before the
  transaction recording them commits;
- ``complete.promoted``: a validated winner is promoted in the transaction, before it commits;
- ``ask.start:<job id>``: an ``ask`` of that job begins.
"""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter
from dataclasses import dataclass
from functools import cache

FAILPOINTS_ENV = "TILETUNE_FAILPOINTS"
ACTIONS = ("kill", "error")


class FailPointError(RuntimeError):
    """Raised at a fail point set to ``error``."""


@dataclass(frozen=True)
class _Point:
    action: str
    at_hit: int


_hits: Counter[str] = Counter()
_guard = threading.Lock()


@cache
def _points() -> dict[str, _Point]:
    points: dict[str, _Point] = {}
    for item in filter(None, (part.strip() for part in os.environ.get(FAILPOINTS_ENV, "").split(","))):
        name, _, rest = item.partition("=")
        action, _, at = rest.partition("@")
        if action not in ACTIONS or not name or (at and not at.isdigit()):
            raise ValueError(f"{FAILPOINTS_ENV}: {item!r} is not point=kill|error[@N]")
        points[name] = _Point(action, int(at) if at else 1)
    return points


def reach(point: str, qualifier: object = None) -> None:
    """Pass the seam ``point`` (``qualifier``: e.g. a job id); act if a test set it (module docstring)."""
    points = _points()
    if not points:
        return
    for name in (point, f"{point}:{qualifier}") if qualifier is not None else (point,):
        found = points.get(name)
        if found is None:
            continue
        with _guard:
            _hits[name] += 1
            due = _hits[name] >= found.at_hit
        if not due:
            continue
        if found.action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise FailPointError(f"fail point {name} reached")
