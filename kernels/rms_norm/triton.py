"""``triton_rms_norm``: ``y = x / sqrt(mean(x^2, last dim) + eps) * w`` in Triton.

Its declaration (knobs, working set, default) is
:class:`~tiletune.kernels.rms_norm.declaration.TritonRmsNormDeclaration`;
dims, inputs, reference and counts are ``rms_norm``'s; the blocking is the
row-wise one of :class:`~tiletune.kernels.softmax.triton.TritonRowSpec`. One
pass when ``block_cols`` covers ``cols``; otherwise a first pass accumulates
each row's sum of squares (float32) over the column blocks and a second loads
each column block again with its slice of ``w`` and writes the result. ``eps`` is the jit
kernel's argument: the call's (``run_with``), or the default (``run``).

Working set: the ``x`` block and the ``w`` slice of every stage in flight,
``(block_rows + 1) * block_cols * element size * num_stages``.

Default: as for every Triton row-wise kernel (see :mod:`tiletune.kernels.softmax.triton`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.rms_norm.declaration import TritonRmsNormDeclaration
from tiletune.kernels.rms_norm.portable import RmsNormSpec
from tiletune.kernels.softmax.triton import TritonRowSpec
from tiletune.kernels.spec import CallArguments


class TritonRmsNormSpec(TritonRmsNormDeclaration, TritonRowSpec, RmsNormSpec):
    """RMS normalisation of each row in Triton, scaled by a weight vector of length ``cols``."""

    def run(
        self, inputs: Sequence[torch.Tensor], config: Config, shape: Shape, backend: str = "triton"
    ) -> torch.Tensor:
        """:meth:`run_with` at the default ``eps``."""
        return self.run_with(inputs, config, shape, backend, {})

    def run_with(
        self,
        inputs: Sequence[torch.Tensor],
        config: Config,
        shape: Shape,
        backend: str,
        arguments: CallArguments,
    ) -> torch.Tensor:
        """rms_norm by the Triton kernel at the call's ``eps``."""
        eps = self.eps_of(arguments)
        kernels, options = self.prepare_launch(inputs, config, backend)
        x, w = self.rows_of(inputs, shape), inputs[1].contiguous()
        out = torch.empty_like(x)
        kernels.rms_norm(x, w, out, eps, config["block_rows"], config["block_cols"], options)
        return out.view(inputs[0].shape)


SPEC = TritonRmsNormSpec()
