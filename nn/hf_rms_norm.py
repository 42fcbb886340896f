"""Hugging Face's RMSNorm modules on ``torch.ops.tiletune.rms_norm``, recognised by shape, with no
import of ``transformers``.

A Hugging Face RMSNorm (``LlamaRMSNorm``, ``Qwen2RMSNorm``, ``MistralRMSNorm`` and the many copies of
them) is a module whose class name ends with ``RMSNorm``, with a 1-D ``weight`` and a float
``variance_epsilon``, whose forward takes the hidden states alone and computes
``weight * x / sqrt(mean(x^2, -1) + eps)`` in float32. :func:`tiletune_class` gives such a class a
forward on :func:`tiletune.nn.functional.rms_norm` at the module's ``variance_epsilon`` (any value:
the operator's argument): the input and the weight in float32, the result cast to Llama's dtype
(``weight`` and input dtypes promoted). Where both are one dtype, every Hugging Face variant returns
that dtype; the result then differs from Llama's by at most one rounding of that dtype (Llama
rounds the normalised input before the weight multiplies it, the kernel once at the end).
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import Tensor

from tiletune.nn import functional

#: The forward each tiletune class has, by the class it was made from.
_classes: dict[type[torch.nn.Module], type[torch.nn.Module]] = {}


def is_hf_rms_norm(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a Hugging Face RMSNorm (see the module docstring) not yet tiletune's."""
    weight = getattr(module, "weight", None)
    return (
        type(module).__name__.endswith("RMSNorm")
        and type(module) not in _classes.values()
        and isinstance(weight, torch.nn.Parameter)
        and weight.dim() == 1
        and isinstance(getattr(module, "variance_epsilon", None), float)
    )


def rms_norm_forward(self: Any, hidden_states: Tensor) -> Tensor:
    """Llama's RMSNorm (in float32, cast back to the promoted dtype) on the operator, at the module's
    ``variance_epsilon``."""
    weight: Tensor = self.weight
    dtype = torch.promote_types(weight.dtype, hidden_states.dtype)
    normed = functional.rms_norm(hidden_states.float(), weight.float(), self.variance_epsilon)
    return normed.to(dtype)


def _reduce_ex(self: torch.nn.Module, protocol: Any) -> tuple[Any, tuple[torch.nn.Module]]:
    """Pickle the module as its Hugging Face class (importable where transformers is) and swap it
    back on load: the tiletune class itself is made at run time, so pickle could not find it."""
    base = type(self).__mro__[1]
    plain = cast(torch.nn.Module, object.__new__(base))
    plain.__dict__.update(self.__dict__)  # the same parameters and buffers, under the base class
    return on_tiletune, (plain,)


def tiletune_class(cls: type[torch.nn.Module]) -> type[torch.nn.Module]:
    """A subclass of ``cls`` (same name, one per class) whose forward is :func:`rms_norm_forward`;
    its instances pickle (``torch.save`` of a whole model) as ``cls``'s and come back as its own."""
    if cls not in _classes:
        namespace = {"forward": rms_norm_forward, "__reduce_ex__": _reduce_ex, "__module__": __name__}
        _classes[cls] = type(cls.__name__, (cls,), namespace)
    return _classes[cls]


def on_tiletune(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` (a Hugging Face RMSNorm) with its class swapped for :func:`tiletune_class`'s."""
    module.__class__ = tiletune_class(type(module))
    return module
