"""``RMSNorm`` and ``Linear`` on tiletune's operators, drop-in for torch's (same parameters and
``state_dict`` keys)."""

from __future__ import annotations

import torch
from torch import Tensor

from tiletune.nn import functional


class RMSNorm(torch.nn.RMSNorm):
    """``torch.nn.RMSNorm`` whose forward is :func:`tiletune.nn.functional.rms_norm` at the module's
    ``eps`` (``None``: ``torch.finfo(x.dtype).eps``, as torch's) for an affine norm over the last dim;
    any other runs torch's."""

    def forward(self, x: Tensor) -> Tensor:
        """The norm of ``x`` over its last dim, times the weight."""
        if self.weight is None or len(self.normalized_shape) != 1:
            return super().forward(x)
        return functional.rms_norm(x, self.weight, self.eps)


class Linear(torch.nn.Linear):
    """``torch.nn.Linear`` whose forward is :func:`tiletune.nn.functional.linear`."""

    def forward(self, x: Tensor) -> Tensor:
        """``x @ weight^T + bias``."""
        return functional.linear(x, self.weight, self.bias)
