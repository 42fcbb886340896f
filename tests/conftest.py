"""Test-wide setup: recorded spaces are always available to the replay tests."""

from __future__ import annotations

import os
from pathlib import Path

from tiletune.kernels.replay.recorded import REPLAY_DIR_ENV, default_replay_dir

BUNDLED_REPLAY_DIR = Path(__file__).parent / "data" / "replay"

if default_replay_dir() is None:
    # A clean clone without ../shared/replay still has one recorded space: the bundled pnpoly.
    os.environ[REPLAY_DIR_ENV] = str(BUNDLED_REPLAY_DIR)
