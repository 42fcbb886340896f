"""``gelu`` as a PyTorch operator, ``torch.ops.tiletune.gelu``: one call of ``register_operator``.

Each call runs the tiled kernel under the config tuned for its shape (looked up when it runs, so
``torch.compile`` keeps the right tiling for every shape) and differentiates through the tanh-GELU
formula below. Importing this module registers the operator.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from tiletune.kernels.ops.plugins import register_operator
from tiletune_example_gelu.spec import SPEC

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_CUBIC = 0.044715


def _save_input(ctx: Any, inputs: tuple[torch.Tensor], output: torch.Tensor) -> None:
    ctx.save_for_backward(inputs[0])


def _gelu_backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
    """``d/dx [x/2 (1 + tanh(u))]`` with ``u = sqrt(2/pi) (x + 0.044715 x^3)``."""
    (x,) = ctx.saved_tensors
    xf = x.double() if x.dtype == torch.float64 else x.float()
    t = torch.tanh(_SQRT_2_OVER_PI * (xf + _CUBIC * xf**3))
    du = _SQRT_2_OVER_PI * (1.0 + 3.0 * _CUBIC * xf**2)
    return (grad * (0.5 * (1.0 + t) + 0.5 * xf * (1.0 - t * t) * du)).to(x.dtype)


gelu = register_operator(SPEC, inputs=("x",), backward=_gelu_backward, setup_context=_save_input)
