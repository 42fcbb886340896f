"""``native_rms_norm``: ``rms_norm`` in C++ (``kernels/native/csrc/rows.cpp``), tiles over cores.

Its declaration (knobs, tile count) is
:class:`~tiletune.kernels.rms_norm.declaration.NativeRmsNormDeclaration`.

Knobs: the row-wise kernels' and ``block_dim``. With whole-row tiles each core copies ``w``
into its local memory once per call; with column tiles ``w``'s slice rides a third queue.
``eps`` is the extension's argument: the call's (``run_with``), or the default (``run``).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

import torch

from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.native.spec import NativeSpec
from tiletune.kernels.rms_norm.declaration import EPS, NativeRmsNormDeclaration
from tiletune.kernels.rms_norm.portable import RmsNormSpec
from tiletune.kernels.spec import CallArguments


class NativeRmsNormSpec(NativeRmsNormDeclaration, NativeSpec, RmsNormSpec):
    """``rms_norm`` as a native CPU kernel."""

    def run_with(
        self,
        inputs: Sequence[torch.Tensor],
        config: Config,
        shape: Shape,
        backend: str,
        arguments: CallArguments,
    ) -> torch.Tensor:
        """The C++ kernel at the call's ``eps``, as ``NativeSpec.run`` runs it at the default (a config
        without ``block_dim`` gets the default cores)."""
        eps = self.eps_of(arguments)
        module, config = self.prepare(inputs, config, shape, backend)
        return self.launch(module, [t.contiguous() for t in inputs], config, shape, eps)

    def launch(
        self,
        module: ModuleType,
        inputs: Sequence[torch.Tensor],
        config: Config,
        shape: Shape,
        eps: float = EPS,
    ) -> torch.Tensor:
        """The extension's ``rms_norm`` at ``eps`` on ``rows x cols``, shaped like ``x``."""
        x, w = inputs
        matrix = x.dim() == 2  # the common case: no reshape or view to pay for per call
        out: torch.Tensor = module.rms_norm(
            x if matrix else x.reshape(-1, shape["cols"]),
            w,
            eps,
            config["tile_rows"],
            config["tile_cols"],
            config["block_dim"],
            config["buffer_num"],
            config["pipeline_depth"],
        )
        return out if matrix else out.view(x.shape)


SPEC = NativeRmsNormSpec()
