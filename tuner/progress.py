"""A progress bar for long work, shown only when stderr is a terminal.

Stdout stays clean for ``--json``; in pipes, CI logs and tests nothing is drawn.
"""

from __future__ import annotations

import sys
from types import TracebackType

from tqdm import tqdm


class ProgressBar:
    """A context manager over tqdm; ``update(done, best_ms)`` moves it to ``done`` steps."""

    def __init__(self, total: int | None, label: str) -> None:
        self._bar = tqdm(
            total=total, desc=label, unit="trial", file=sys.stderr, disable=not sys.stderr.isatty()
        )

    def update(self, done: int, best_ms: float | None) -> None:
        """Show ``done`` completed steps and the best time so far."""
        self._bar.n = done
        if best_ms is not None:
            self._bar.set_postfix_str(f"best {best_ms:.4f} ms", refresh=False)
        self._bar.refresh()

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._bar.close()
