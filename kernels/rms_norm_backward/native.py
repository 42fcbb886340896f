"""``native_rms_norm_backward``: ``rms_norm``'s gradients in C++
(``kernels/native/csrc/rms_norm_backward.cpp``), row tiles over cores.

Its declaration (knobs, tile count) is
:class:`~tiletune.kernels.rms_norm_backward.declaration.NativeRmsNormBackwardDeclaration`.

Knobs: the row-wise kernels' and ``block_dim``. With whole-row tiles each core copies ``w`` into its
local memory once per call; with column tiles ``w``'s slice rides a third queue. Each core keeps
``cols`` float32 partial sums of ``dw``; they are added in core order after the cores finish.
``eps`` is the extension's argument: the call's (``run_with``), or the default (``run``).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

import torch

from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.native.space import NATIVE_BACKEND
from tiletune.kernels.native.spec import NativeSpec
from tiletune.kernels.rms_norm.declaration import EPS
from tiletune.kernels.rms_norm_backward.declaration import NativeRmsNormBackwardDeclaration
from tiletune.kernels.rms_norm_backward.portable import RmsNormBackwardSpec
from tiletune.kernels.spec import CallArguments


class NativeRmsNormBackwardSpec(NativeRmsNormBackwardDeclaration, NativeSpec, RmsNormBackwardSpec):
    """``rms_norm_backward`` as a native CPU kernel: ``(dx, dw)``.

    ``NativeSpec`` declares ``run`` and ``launch`` of one tensor (``torch.Tensor``); a backward
    kernel's give its gradients' tuple (``KernelOutput``), hence the overrides' type ignores."""

    def run(  # type: ignore[override]
        self, inputs: Sequence[torch.Tensor], config: Config, shape: Shape, backend: str = NATIVE_BACKEND
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`run_with` at the default ``eps``."""
        return self.run_with(inputs, config, shape, backend, {})

    def run_with(
        self,
        inputs: Sequence[torch.Tensor],
        config: Config,
        shape: Shape,
        backend: str,
        arguments: CallArguments,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The C++ kernel's ``(dx, dw)`` at the call's ``eps``; a config without ``block_dim`` gets the
        default cores."""
        eps = self.eps_of(arguments)
        module, config = self.prepare(inputs, config, shape, backend)
        return self.launch(module, [t.contiguous() for t in inputs], config, shape, eps)

    def launch(  # type: ignore[override]
        self,
        module: ModuleType,
        inputs: Sequence[torch.Tensor],
        config: Config,
        shape: Shape,
        eps: float = EPS,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The extension's ``rms_norm_backward`` at ``eps`` on ``rows x cols``: ``dx`` shaped like
        ``x``, ``dw``."""
        x, w, grad = inputs
        matrix = x.dim() == 2  # the common case: no reshape or view to pay for per call
        dx, dw = module.rms_norm_backward(
            x if matrix else x.reshape(-1, shape["cols"]),
            w,
            grad if matrix else grad.reshape(-1, shape["cols"]),
            eps,
            config["tile_rows"],
            config["tile_cols"],
            config["block_dim"],
            config["buffer_num"],
            config["pipeline_depth"],
        )
        return (dx if matrix else dx.view(x.shape)), dw


SPEC = NativeRmsNormBackwardSpec()
