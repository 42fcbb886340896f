"""Fixtures of the kernels' tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch._dynamo


@pytest.fixture
def fresh_dynamo() -> Iterator[None]:
    """torch.compile's caches emptied before and after the test (its graph counts are its own)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
