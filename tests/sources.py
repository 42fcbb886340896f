"""Config sources for tests that watch the operators run their tiles: every key answered with its
kernel's rule as a measured answer, so no call's answer is torch's op (which runs torch's function
itself: :mod:`tiletune.kernels.ops.torch_path`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tiletune.kernels.device import cpu_chip
from tiletune.kernels.registry import get_kernel


@dataclass(frozen=True)
class Answer:
    """A source's answer: the config, matched exactly."""

    config: Mapping[str, int]
    match: str = "exact"


class MeasuredRules:
    """Answers each key with its kernel's default rule for this CPU, as a measured answer (the same
    answer object for the same key, as a ``ConfigClient`` does)."""

    def __init__(self) -> None:
        self._answers: dict[tuple[str, tuple[tuple[str, int], ...], str], Answer] = {}

    def get(self, kernel: str, shape: Mapping[str, int], /, *, dtype: str) -> Answer:
        """The rule of ``kernel`` for the key."""
        key = (kernel, tuple(shape.items()), dtype)
        if key not in self._answers:
            self._answers[key] = Answer(
                get_kernel(kernel).default_config(dict(shape), dtype, cpu_chip().limits)
            )
        return self._answers[key]
