"""``patch(model)``: a model runs on tiletune's operators with no change to its code.

- every ``torch.nn.RMSNorm`` and ``torch.nn.Linear`` module becomes tiletune's
  (:mod:`tiletune.nn.layers`: the same parameters, not copies, and the same ``state_dict``);
- every Hugging Face RMSNorm (``LlamaRMSNorm`` and its kind, :mod:`tiletune.nn.hf_rms_norm`) runs
  on the operator too (a subclass of its own class, so ``isinstance`` and its parameters hold);
- the model's ``forward`` runs inside a torch function mode that sends
  ``torch.nn.functional.scaled_dot_product_attention`` to
  :func:`tiletune.nn.functional.scaled_dot_product_attention` (what a model's own attention code,
  Hugging Face's ``sdpa`` attention among them, calls).

In the style of Liger-Kernel's ``apply_liger_kernel_to_*``: call it once, after building the model
and before ``torch.compile``.
"""

from __future__ import annotations

from typing import Any, TypeVar

import torch
import torch.nn.functional as torch_functional
from torch.overrides import TorchFunctionMode

from tiletune.nn import functional, hf_rms_norm
from tiletune.nn.layers import Linear, RMSNorm

ModelT = TypeVar("ModelT", bound=torch.nn.Module)


class AttentionMode(TorchFunctionMode):
    """Sends ``F.scaled_dot_product_attention`` to tiletune's; every other function runs as ever."""

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        """Dispatch ``func``: the attention to tiletune's, the rest unchanged."""
        kwargs = kwargs or {}
        if func is torch_functional.scaled_dot_product_attention:
            return functional.scaled_dot_product_attention(*args, **kwargs)
        return func(*args, **kwargs)


def _swap_modules(module: torch.nn.Module) -> int:
    """Swap ``module``'s RMSNorm and Linear children (recursively) for tiletune's; how many."""
    swapped = 0
    for child in module.children():
        swapped += _swap_modules(child)
        if type(child) is torch.nn.RMSNorm:
            child.__class__ = RMSNorm
            swapped += 1
        elif type(child) is torch.nn.Linear:
            child.__class__ = Linear
            swapped += 1
        elif hf_rms_norm.is_hf_rms_norm(child):
            child.__class__ = hf_rms_norm.tiletune_class(type(child))
            swapped += 1
    return swapped


class ForwardInAttentionMode:
    """A patched model's ``forward``: the model's own, inside :class:`AttentionMode`. An object, not a
    closure, so that a patched model pickles whole (``torch.save(model)``)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.own_forward = model.__dict__.get("forward")  # a forward set on the instance, if any

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The model's forward on ``args``, its attention on tiletune's operator."""
        with AttentionMode():
            if self.own_forward is not None:
                return self.own_forward(*args, **kwargs)
            return type(self.model).forward(self.model, *args, **kwargs)


def patch(model: ModelT) -> ModelT:
    """Run ``model`` on tiletune's operators (see the module docstring); returns it, patched in place."""
    _swap_modules(model)
    if isinstance(model.__dict__.get("forward"), ForwardInAttentionMode):
        return model
    model.forward = ForwardInAttentionMode(model)
    return model
