"""A config source for the tests that watch the operators run: every key answered with its kernel's
rule as a measured answer, so no call's answer is torch's op (which runs torch's function itself:
``tiletune.kernels.ops.torch_path``)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pytest

from tiletune.kernels.device import cpu_chip
from tiletune.kernels.ops import using_source
from tiletune.kernels.registry import get_kernel


@dataclass(frozen=True)
class Answer:
    """A source's answer: the config, matched exactly."""

    config: Mapping[str, int]
    match: str = "exact"


class MeasuredRules:
    """Answers each key with its kernel's default rule for this CPU, as a measured answer."""

    def get(self, kernel: str, shape: Mapping[str, int], /, *, dtype: str) -> Answer:
        """The rule of ``kernel`` for the key."""
        return Answer(get_kernel(kernel).default_config(dict(shape), dtype, cpu_chip().limits))


@pytest.fixture
def tiled_answers() -> Iterator[None]:
    """The test's operator calls run under :class:`MeasuredRules`."""
    with using_source(MeasuredRules()):
        yield
