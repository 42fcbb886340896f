"""``patch(model)``: a model runs on tiletune's operators with no change to its code.

- every ``torch.nn.RMSNorm`` and ``torch.nn.Linear`` module becomes tiletune's
  (:mod:`tiletune.nn.layers`: the same parameters, not copies, and the same ``state_dict``);
- every Hugging Face RMSNorm (``LlamaRMSNorm`` and its kind, :mod:`tiletune.nn.hf_rms_norm`) runs
  on the operator too (a subclass of its own class, so ``isinstance`` and its parameters hold);
- the model's ``forward`` runs inside a torch function mode that sends
  ``torch.nn.functional.scaled_dot_product_attention`` to
  :func:`tiletune.nn.functional.scaled_dot_product_attention` (what a model's own attention code,
  Hugging Face's ``sdpa`` attention among them, calls).

What it leaves, and why (:class:`PatchSummary`): an ``nn.RMSNorm`` without an affine weight or
normalised over more than the last dim (tiletune's would run torch's for it); a subclass of
``nn.Linear`` or ``nn.RMSNorm`` (its forward may be its own); a module named ``*RMSNorm`` that is
not of Llama's kind (Gemma's ``1 + weight``); and, counted but not entered, the well-known kinds
tiletune has no operator for (``nn.LayerNorm``, ``nn.GroupNorm``, ``nn.MultiheadAttention``, which
runs its own projections). Other modules (``nn.Embedding``, convolutions, ...) are not listed.

Each call logs its summary, one line at INFO on ``tiletune.nn.patch``, and keeps it for
:func:`patch_summary`. Patching again swaps nothing twice and wraps the forward once.

In the style of Liger-Kernel's ``apply_liger_kernel_to_*``: call it once, after building the model
and before ``torch.compile``.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import torch

from tiletune.nn import hf_rms_norm
from tiletune.nn.functional import AttentionMode
from tiletune.nn.layers import Linear, RMSNorm

log = logging.getLogger(__name__)

ModelT = TypeVar("ModelT", bound=torch.nn.Module)

#: Why a module of a kind tiletune has no operator for was left.
NO_OPERATOR = "no tiletune operator"
#: The kinds counted as left for :data:`NO_OPERATOR` (and not entered: their forward is their own).
NO_OPERATOR_KINDS = (torch.nn.LayerNorm, torch.nn.GroupNorm, torch.nn.MultiheadAttention)


@dataclass(frozen=True)
class PatchSummary:
    """What one :func:`patch` call left the model running.

    - ``replaced``: the modules on tiletune's operators, by the class name they had (``Linear``,
      ``RMSNorm``, ``LlamaRMSNorm``, ...), whether this call or an earlier one swapped them (so a
      second call counts each module once, as the first did);
    - ``left``: the modules left on torch's code, by (class name, reason): see the module docstring;
    - ``attention``: ``"routed"`` when this call made the model's forward send
      ``F.scaled_dot_product_attention`` to tiletune's, ``"already routed"`` when an earlier call had.

    Most numerous first in each. ``str()`` is the line :func:`patch` logs.
    """

    replaced: dict[str, int]
    left: dict[tuple[str, str], int]
    attention: Literal["routed", "already routed"]

    def __str__(self) -> str:
        replaced = ", ".join(f"{count} {kind}" for kind, count in self.replaced.items())
        parts = [f"replaced {replaced or 'nothing'}", f"attention {self.attention} through tiletune"]
        if self.left:
            left = ", ".join(f"{count} {kind} ({why})" for (kind, why), count in self.left.items())
            parts.append(f"left {left}")
        return "tiletune.patch: " + "; ".join(parts)


def _rms_norm_left(module: torch.nn.RMSNorm) -> str | None:
    """Why tiletune's ``RMSNorm`` would run torch's for ``module`` (see its forward), or ``None``."""
    weight: torch.Tensor | None = module.weight  # None without elementwise_affine (torch types it not so)
    if weight is None:
        return "no affine weight"
    if len(module.normalized_shape) != 1:
        return "normalised over more than the last dim"
    return None


def _take(module: torch.nn.Module) -> tuple[str, str | None] | None:
    """Swap ``module``'s class for tiletune's where it can: (its class name, ``None``) when it runs on
    tiletune's operator (now or since an earlier patch), (its class name, why) when it is left,
    ``None`` when it is of no kind :class:`PatchSummary` lists."""
    cls = type(module)
    kind = cls.__name__
    if cls in (torch.nn.RMSNorm, RMSNorm):
        assert isinstance(module, torch.nn.RMSNorm)
        why = _rms_norm_left(module)
        if why is None:
            module.__class__ = RMSNorm
        return kind, why
    if cls is torch.nn.Linear:
        module.__class__ = Linear
        return kind, None
    if cls is Linear or cls.__module__ == hf_rms_norm.__name__:  # an earlier patch's
        return kind, None
    if hf_rms_norm.is_hf_rms_norm(module):
        hf_rms_norm.on_tiletune(module)
        return kind, None
    if isinstance(module, torch.nn.Linear):
        return kind, "a subclass of nn.Linear: its forward may differ"
    if isinstance(module, torch.nn.RMSNorm):
        return kind, "a subclass of nn.RMSNorm: its forward may differ"
    if kind.endswith("RMSNorm"):
        return kind, "not Llama's kind of RMSNorm"
    if isinstance(module, NO_OPERATOR_KINDS):
        return kind, NO_OPERATOR
    return None


def _submodules(module: torch.nn.Module, seen: set[int]) -> Iterator[torch.nn.Module]:
    """``module``'s submodules, each once (a shared one too), none inside a :data:`NO_OPERATOR_KINDS`."""
    for child in module.children():
        if id(child) in seen:
            continue
        seen.add(id(child))
        yield child
        if not isinstance(child, NO_OPERATOR_KINDS):
            yield from _submodules(child, seen)


def _swap_modules(model: torch.nn.Module) -> tuple[Counter[str], Counter[tuple[str, str]]]:
    """Swap ``model``'s RMSNorm and Linear submodules (not ``model`` itself) for tiletune's: the
    modules on tiletune's operators and those left, as :class:`PatchSummary` counts them."""
    replaced: Counter[str] = Counter()
    left: Counter[tuple[str, str]] = Counter()
    for module in _submodules(model, {id(model)}):
        taken = _take(module)
        if taken is None:
            continue
        kind, why = taken
        if why is None:
            replaced[kind] += 1
        else:
            left[(kind, why)] += 1
    return replaced, left


class ForwardInAttentionMode:
    """A patched model's ``forward``: the model's own, inside :class:`AttentionMode`. An object, not a
    closure, so that a patched model pickles whole (``torch.save(model)``). Holds the summary of
    the model's last :func:`patch`."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.own_forward = model.__dict__.get("forward")  # a forward set on the instance, if any
        self.summary: PatchSummary | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The model's forward on ``args``, its attention on tiletune's operator."""
        with AttentionMode():
            if self.own_forward is not None:
                return self.own_forward(*args, **kwargs)
            return type(self.model).forward(self.model, *args, **kwargs)


def patch(model: ModelT) -> ModelT:
    """Run ``model`` on tiletune's operators (see the module docstring); returns it, patched in place.

    Logs what it did (:class:`PatchSummary`, one line at INFO) and keeps it for :func:`patch_summary`.
    """
    replaced, left = _swap_modules(model)
    forward = model.__dict__.get("forward")
    attention: Literal["routed", "already routed"] = "already routed"
    if not isinstance(forward, ForwardInAttentionMode):
        forward, attention = ForwardInAttentionMode(model), "routed"
        model.forward = forward
    forward.summary = PatchSummary(dict(replaced.most_common()), dict(left.most_common()), attention)
    log.info("%s", forward.summary)
    return model


def patch_summary(model: torch.nn.Module) -> PatchSummary | None:
    """The summary of ``model``'s last :func:`patch` (kept when it pickles), ``None`` if never patched."""
    forward = model.__dict__.get("forward")
    return getattr(forward, "summary", None) if isinstance(forward, ForwardInAttentionMode) else None
