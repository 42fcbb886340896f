"""A model on tiletune's operators, configured with a real server that goes away mid-run: nothing
changes but where the answers come from (the client's cache and the kernels' rules), no step fails
or hangs."""

from __future__ import annotations

import time
from pathlib import Path

import torch

import tiletune
from tests.credentials import ADMIN_TOKEN
from tests.nn.test_patch import Block
from tests.service.processes import serving_this_chip
from tiletune.kernels.ops import configure

#: A step here takes milliseconds; a client waiting on a dead server would take its timeouts.
STEP_LIMIT_S = 30.0


def test_a_patched_model_runs_on_when_its_server_goes_away(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = tiletune.patch(Block())
    short, long = torch.randn(1, 24, 64), torch.randn(1, 40, 64)
    try:
        with serving_this_chip(tmp_path) as server:
            client = configure(url=server.url, token=ADMIN_TOKEN)
            assert client is not None
            before = model(short)
            asked_before = model(long)  # a second key, asked of the server too
        # the server is stopped: the same keys, and one the client never asked
        started = time.monotonic()
        after, asked_after = model(short), model(long)
        unseen = model(torch.randn(1, 33, 64))
        torch.autograd.backward(model(short).sum())
        assert time.monotonic() - started < STEP_LIMIT_S
    finally:
        configure(None)
    torch.testing.assert_close(after, before)
    torch.testing.assert_close(asked_after, asked_before)
    assert unseen.shape == (1, 33, 64)
    assert all(p.grad is not None for p in model.parameters())
