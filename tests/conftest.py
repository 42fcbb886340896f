"""Test-wide setup: recorded spaces are always available to the replay tests, and Triton runs in its
interpreter.

``TRITON_INTERPRET=1`` is set before anything imports triton (``torch._dynamo`` does, for
``torch.compile``): a triton imported without it keeps state that breaks the interpreted kernels of
a later test. Tests of what happens without it unset it themselves, or run a subprocess."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from tiletune.kernels.replay.recorded import REPLAY_DIR_ENV, default_replay_dir

if importlib.util.find_spec("torch") is not None:  # not on a server install (`make test-lowest`)
    from tiletune.kernels.triton.spec import INTERPRET_ENV

    os.environ[INTERPRET_ENV] = "1"

BUNDLED_REPLAY_DIR = Path(__file__).parent / "data" / "replay"

if default_replay_dir() is None:
    # A clean clone without ../shared/replay still has one recorded space: the bundled pnpoly.
    os.environ[REPLAY_DIR_ENV] = str(BUNDLED_REPLAY_DIR)
