"""``tiletune ARGS`` run in the test's own process (:func:`tiletune.service.cli.main`), its output
captured: what the command-line tests share (the console script itself: ``processes.run_cli``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tiletune.client.wire import SweepPublic
from tiletune.service.cli import main


class Cli:
    """``tiletune ARGS`` in this process: exit status, stdout, stderr."""

    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self._capsys = capsys

    def __call__(self, *args: str) -> tuple[int, str, str]:
        self._capsys.readouterr()
        status = main(list(args))
        out, err = self._capsys.readouterr()
        return status, out, err

    def json(self, *args: str) -> Any:
        """``tiletune ARGS --json``, which must succeed: its one document."""
        status, out, err = self(*args, "--json")
        assert status == 0, err
        return json.loads(out)

    def sweep(self, *args: str) -> SweepPublic:
        """``tiletune submit ARGS --json``, which must succeed: its sweep."""
        return SweepPublic.model_validate(self.json("submit", *args))
