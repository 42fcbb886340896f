"""Replay kernels' specs: a recorded space's declaration (:mod:`tiletune.kernels.replay.declaration`)
with nothing to run.

``make_inputs``, ``reference``, ``run``: there is nothing to run; each raises
:class:`NotRunnableError`. ``backends()`` is ``("replay",)``, ``supports(kind)`` is true for the
``replay`` device kind alone: a worker with ``--backend replay``
(:class:`~tiletune.kernels.device.ReplayDevice`) "measures" a config by looking its time up.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NoReturn

import torch

from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.replay.declaration import (
    REPLAY_KIND,
    ReplayDeclaration,
    registered_replay_directory,
    replay_space_names,
)
from tiletune.kernels.spec import KernelSpec


class NotRunnableError(RuntimeError):
    """A replay kernel was asked to run: it has no inputs or implementation, only recorded times."""


class ReplayKernelSpec(ReplayDeclaration, KernelSpec):
    """One recorded space as a kernel: its declaration, and nothing to run."""

    def backends(self) -> tuple[str, ...]:
        """``replay``: the lookup on a replay device."""
        return (REPLAY_KIND,)

    def supports(self, device_kind: str) -> bool:
        """Only a replay device "runs" a recorded space."""
        return device_kind == REPLAY_KIND

    def make_inputs(
        self, shape: Shape, dtype: str, device: torch.device, seed: int = 0
    ) -> tuple[torch.Tensor, ...]:
        """Raises :class:`NotRunnableError`: a recorded space has no inputs."""
        self._not_runnable("make_inputs")

    def reference(self, inputs: Sequence[torch.Tensor], shape: Shape) -> torch.Tensor:
        """Raises :class:`NotRunnableError`: a recorded space has no reference."""
        self._not_runnable("reference")

    def run(
        self, inputs: Sequence[torch.Tensor], config: Config, shape: Shape, backend: str = "torch"
    ) -> torch.Tensor:
        """Raises :class:`NotRunnableError`: a recorded space has no implementation."""
        self._not_runnable("run")

    def _not_runnable(self, what: str) -> NoReturn:
        raise NotRunnableError(
            f"kernel {self.name!r} is a recorded space: it has no {what}; it is measured by lookup "
            f"on a replay device (tiletune worker --backend replay)"
        )


def replay_kernels(directory: Path | str) -> dict[str, ReplayKernelSpec]:
    """A spec per recorded space in ``directory``, by kernel name, sorted; nothing is parsed yet
    (:func:`~tiletune.kernels.replay.declaration.replay_space_names`)."""
    return {
        name: ReplayKernelSpec(space, path) for name, (space, path) in replay_space_names(directory).items()
    }


def registered_replay_kernels(environ: Mapping[str, str] = os.environ) -> dict[str, ReplayKernelSpec]:
    """The replay kernels of ``$TILETUNE_REPLAY_KERNELS``'s directory; none when it is unset or empty."""
    return {
        name: ReplayKernelSpec(space, path)
        for name, (space, path) in registered_replay_directory(environ).items()
    }


def is_replay_kernel(spec: KernelSpec) -> bool:
    """True for a recorded space's spec."""
    return isinstance(spec, ReplayKernelSpec)
