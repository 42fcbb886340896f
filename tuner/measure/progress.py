"""A progress bar for long work, shown only when stderr is a terminal and tqdm is installed.

Stdout stays clean for ``--json``; in pipes, CI logs and tests nothing is drawn, and on the
base install (no tqdm) the bar is silent too. Imports the standard library only (tqdm lazily).
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import Any


def _tqdm(total: int | None, label: str, unit: str) -> Any:
    if not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # the base install has no tqdm: no bar
        return None
    return tqdm(total=total, desc=label, unit=unit, file=sys.stderr)


class ProgressBar:
    """A context manager over tqdm; ``update(done, best_ms)`` moves it to ``done`` steps."""

    def __init__(self, total: int | None, label: str, unit: str = "trial") -> None:
        self._bar = _tqdm(total, label, unit)

    def update(self, done: int, best_ms: float | None) -> None:
        """Show ``done`` completed steps and the best time so far."""
        self.show(done, f"best {best_ms:.4f} ms" if best_ms is not None else None)

    def show(self, done: int, note: str | None = None) -> None:
        """Show ``done`` completed steps and ``note`` beside them."""
        if self._bar is None:
            return
        self._bar.n = done
        if note is not None:
            self._bar.set_postfix_str(note, refresh=False)
        self._bar.refresh()

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._bar is not None:
            self._bar.close()
