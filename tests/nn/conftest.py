"""The tests that watch the operators run use ``tiled_answers``: every key answered with its
kernel's rule as a measured answer (:class:`tests.sources.MeasuredRules`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.sources import MeasuredRules
from tiletune.kernels.ops import using_source


@pytest.fixture
def tiled_answers() -> Iterator[None]:
    """The test's operator calls run under :class:`MeasuredRules`."""
    with using_source(MeasuredRules()):
        yield
