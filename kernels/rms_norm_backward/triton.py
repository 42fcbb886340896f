"""``triton_rms_norm_backward``: ``rms_norm``'s gradients ``(dx, dw)`` in Triton.

Its declaration (knobs, working set, default) is
:class:`~tiletune.kernels.rms_norm_backward.declaration.TritonRmsNormBackwardDeclaration`;
dims, inputs, reference and counts are ``rms_norm_backward``'s; the blocking is the row-wise one
of :class:`~tiletune.kernels.softmax.triton.TritonRowSpec`, with a program walking several row
blocks (as many programs as the device has multiprocessors) so that it keeps one row of float32
``dw`` partial sums. One pass when ``block_cols`` covers ``cols``; otherwise a first pass
accumulates each row's ``sum(x^2)`` and ``sum(g w x)`` (float32) over the column blocks and a
second loads each column block of ``x``, ``grad`` and ``w`` again, writes ``dx`` and adds to the
program's ``dw`` sums (``kernels/triton/rms_norm_backward_jit.py``). The programs' sums are added
in program order. ``eps`` is the jit kernel's argument: the call's (``run_with``), or the default
(``run``).

Working set: the ``x`` and ``grad`` blocks and the ``w`` slice of every stage in flight, and one
column block of float32 ``dw`` sums:
``(2 * block_rows + 1) * block_cols * element size * num_stages + 4 * block_cols``.

Default: as for every Triton row-wise kernel (see :mod:`tiletune.kernels.softmax.triton`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.rms_norm_backward.declaration import TritonRmsNormBackwardDeclaration
from tiletune.kernels.rms_norm_backward.portable import RmsNormBackwardSpec
from tiletune.kernels.softmax.triton import TritonRowSpec
from tiletune.kernels.spec import CallArguments

#: The module of ``@triton.jit`` kernels this kernel runs (``tiletune.kernels.triton.<module>``).
KERNELS_MODULE = "rms_norm_backward_jit"


class TritonRmsNormBackwardSpec(TritonRmsNormBackwardDeclaration, TritonRowSpec, RmsNormBackwardSpec):
    """rms_norm's gradients ``(dx, dw)`` in Triton, two passes when a row spans blocks."""

    def run(
        self, inputs: Sequence[torch.Tensor], config: Config, shape: Shape, backend: str = "triton"
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
        """``(dx, dw)`` by the Triton kernel at the call's ``eps``: ``dx`` shaped like ``x``, ``dw`` in
        ``w``'s dtype."""
        eps = self.eps_of(arguments)
        kernels, options = self.prepare_launch(inputs, config, backend, module=KERNELS_MODULE)
        x, w = self.rows_of(inputs, shape), inputs[1].contiguous()
        grad = inputs[2].reshape(-1, shape["cols"]).contiguous()
        dx = torch.empty_like(x)
        blocks = (config["block_rows"], config["block_cols"])
        dw: torch.Tensor = kernels.rms_norm_backward(x, w, grad, dx, eps, blocks, options)
        return dx.view(inputs[0].shape), dw.to(w.dtype)


SPEC = TritonRmsNormBackwardSpec()
