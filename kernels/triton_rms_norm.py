"""``triton_rms_norm``: ``y = x / sqrt(mean(x^2, last dim) + eps) * w`` in Triton.

Dims, inputs, reference and counts are ``rms_norm``'s; the blocking is the
row-wise one of :class:`~tiletune.kernels.triton_softmax.TritonRowSpec`. One
pass when ``block_cols`` covers ``cols``; otherwise a first pass accumulates
each row's sum of squares (float32) over the column blocks and a second loads
each column block again with its slice of ``w`` and writes the result.

Working set: the ``x`` block and the ``w`` slice of every stage in flight,
``(block_rows + 1) * block_cols * element size * num_stages``.

Default: as for every Triton row-wise kernel (see :mod:`tiletune.kernels.triton_softmax`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tiletune.kernels.rms_norm import RmsNormSpec
from tiletune.kernels.spec import Config, Shape, element_size
from tiletune.kernels.triton_softmax import TritonRowSpec


class TritonRmsNormSpec(TritonRowSpec, RmsNormSpec):
    """RMS normalisation of each row in Triton, scaled by a weight vector of length ``cols``."""

    name = "triton_rms_norm"
    version = 1
    description = "rms_norm in Triton: block_rows rows per program, two passes when a row spans blocks"

    def _state_bytes(self, config: Config, shape: Shape, dtype: str) -> int:
        """The slice of ``w`` loaded with each block."""
        return config["block_cols"] * element_size(dtype) * config["num_stages"]

    def run(
        self, inputs: Sequence[torch.Tensor], config: Config, shape: Shape, backend: str = "triton"
    ) -> torch.Tensor:
        """rms_norm by the Triton kernel."""
        kernels, options = self.prepare_launch(inputs, config, backend)
        x, w = self.rows_of(inputs, shape), inputs[1].contiguous()
        out = torch.empty_like(x)
        kernels.rms_norm(x, w, out, config["block_rows"], config["block_cols"], options)
        return out.view(inputs[0].shape)


SPEC = TritonRmsNormSpec()
