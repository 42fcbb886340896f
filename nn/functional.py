"""Functions with torch's signatures and semantics, run by tiletune's operators where they cover the call.

A call the operators do not cover (dropout, say) runs torch's own function instead, with one log
line per reason, never an error. A call whose answer is torch's op (measured, or the choice of a
key with no measured answer) runs torch's function itself, its autograd too, with nothing added
beyond the lookup (:mod:`tiletune.kernels.ops.torch_path`): in eager mode, outside autocast, on
tensors of one dtype and device; a compiled graph keeps the operator.
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
import torch.nn.functional as torch_functional
from torch import Tensor
from torch.nn.attention.bias import CausalBias, CausalVariant
from torch.overrides import TorchFunctionMode

import tiletune.kernels.ops  # noqa: F401  (registers torch.ops.tiletune)
from tiletune.kernels.fused_attention.declaration import CAUSAL_BOTTOM_RIGHT, CAUSAL_TOP_LEFT, NO_CAUSAL
from tiletune.kernels.ops.definitions import gradient_products
from tiletune.kernels.ops.torch_path import Call, runs_torch
from tiletune.kernels.rms_norm.declaration import EPS
from tiletune.kernels.spec import dtype_name

logger = logging.getLogger(__name__)

#: dtypes the operators take (float64: their reference formula, for gradient checks).
OPERATOR_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
#: dtypes the operators look configs up for.
TUNED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

#: Tensor types whose torch function handling is torch's own (a ``Parameter`` disables its own).
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)

_logged: set[str] = set()


class AttentionMode(TorchFunctionMode):
    """Sends ``F.scaled_dot_product_attention`` to tiletune's; every other function runs as ever
    (a patched model's forward runs inside it: :func:`tiletune.nn.patch`)."""

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        """Dispatch ``func``: the attention to tiletune's, the rest unchanged."""
        kwargs = kwargs or {}
        if func is torch_functional.scaled_dot_product_attention:
            return scaled_dot_product_attention(*args, **kwargs)
        return func(*args, **kwargs)


def _outside_attention_mode(*tensors: Tensor) -> AbstractContextManager[object]:
    """Where :class:`AttentionMode` is the only torch function mode and ``tensors`` are plain, a
    context that leaves it for the body of a function below (torch would call it for each tensor
    attribute the body reads, and the body calls no attention);
    else one that changes nothing (another mode, a subclass, compiling: their handling stays)."""
    if (
        torch._C._len_torch_function_stack() == 1
        and not torch.compiler.is_compiling()
        and isinstance(torch._C._get_function_stack_at(0), AttentionMode)
        and all(type(t) in _PLAIN_TENSORS for t in tensors)
    ):
        return torch._C.DisableTorchFunction()
    return nullcontext()


def _torch_may_run(*tensors: Tensor) -> bool:
    """Whether torch's function may stand in for the operator on ``tensors`` (the module docstring's
    conditions, :mod:`~tiletune.kernels.ops.torch_path` deciding the rest): one dtype the kernels
    tune, one device, no autocast there."""
    first = tensors[0]
    return (
        first.dtype in TUNED_DTYPES
        and all(t.dtype == first.dtype and t.device == first.device for t in tensors[1:])
        and not torch.is_autocast_enabled(first.device.type)
    )


def _records_grad(*tensors: Tensor) -> bool:
    """Whether autograd records a call on ``tensors``."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _fall_back(reason: str) -> None:
    """Log ``reason`` once per process (not while compiling: a graph holds no log call)."""
    if reason not in _logged and not torch.compiler.is_compiling():
        _logged.add(reason)
        logger.info("tiletune: %s; torch's own function runs it", reason)


def _attention_fallback_reason(
    query: Tensor, key: Tensor, value: Tensor, *, dropout_p: float, enable_gqa: bool
) -> str | None:
    """Why the attention operator does not cover this call, or None when it does."""
    if dropout_p > 0.0:
        return "scaled_dot_product_attention with dropout_p > 0"
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return "scaled_dot_product_attention on tensors other than [batch, heads, seq, head_dim]"
    if value.shape[-1] != query.shape[-1] or query.dtype not in OPERATOR_DTYPES:
        return "scaled_dot_product_attention with a value head_dim or dtype the kernel does not take"
    if len({query.dtype, key.dtype, value.dtype}) > 1 or len({query.device, key.device, value.device}) > 1:
        return "scaled_dot_product_attention on mixed dtypes or devices"
    heads, kv_heads = query.shape[1], key.shape[1]
    if heads != kv_heads and not (enable_gqa and heads % kv_heads == 0):
        return "scaled_dot_product_attention with query and key heads that do not group"
    return None


def _mask_operand(
    attn_mask: Tensor | CausalBias | None, query: Tensor, key: Tensor, is_causal: bool
) -> tuple[Tensor | None, int] | str:
    """The operator's ``(mask, causal)`` for SDPA's ``attn_mask`` and ``is_causal``, or why not.

    ``is_causal`` is torch's top-left alignment (``causal=1``); a ``CausalBias`` (torch's
    ``causal_upper_left`` / ``causal_lower_right``) is ``causal`` 1 / 2 with no mask; a boolean mask
    (True: attend) becomes additive (0 / -inf) in the query's dtype; a float mask is cast to it.
    Masks broadcast as torch's do; the operator reads them through their strides (no copy of a
    broadcast dim).
    """
    if isinstance(attn_mask, CausalBias):
        if is_causal:
            return "scaled_dot_product_attention with is_causal and a CausalBias"
        return (
            None,
            CAUSAL_BOTTOM_RIGHT if attn_mask.variant == CausalVariant.LOWER_RIGHT else CAUSAL_TOP_LEFT,
        )
    if attn_mask is None:
        return None, CAUSAL_TOP_LEFT if is_causal else NO_CAUSAL
    if is_causal or attn_mask.dim() > 4:
        return "scaled_dot_product_attention with both attn_mask and is_causal, or a mask of more than 4 dims"
    if attn_mask.device != query.device:
        return "scaled_dot_product_attention with a mask on another device"
    mask = attn_mask
    if mask.dtype == torch.bool:
        mask = torch.zeros((), dtype=query.dtype, device=query.device).masked_fill(~mask, float("-inf"))
    elif mask.dtype != query.dtype:
        mask = mask.to(query.dtype)
    mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    size = (query.shape[0], query.shape[1], query.shape[2], key.shape[2])
    try:
        full = mask.expand(size)
    except RuntimeError:
        return "scaled_dot_product_attention with a mask not broadcastable to [batch, heads, seq_q, seq_kv]"
    # whole seq_q x seq_kv planes (stride 0 where broadcast), batch and heads kept at 1 where they are
    return full[: mask.shape[0], : mask.shape[1]], NO_CAUSAL


def scaled_dot_product_attention(  # noqa: PLR0917  (torch's signature, positions included)
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | CausalBias | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    """``torch.nn.functional.scaled_dot_product_attention``, on ``torch.ops.tiletune.fused_attention``.

    Covered: ``scale``; grouped-query attention (``enable_gqa``: ``key`` and ``value`` with fewer
    heads, each shared by ``heads / kv_heads`` query heads, read in place); boolean and additive
    masks broadcast to ``[batch, heads, seq_q, seq_kv]``; ``is_causal`` (top-left aligned, as torch's
    own: query ``i`` sees keys ``j <= i`` whatever the lengths) and torch's ``CausalBias`` masks
    (``causal_lower_right``: bottom-right aligned, as FlashAttention-2 and a chunked prefill need).
    A query row that sees no key gives 0 (torch's gives NaN). Not covered, run by torch's own
    function with one log line: dropout, tensors other than 4-D, another value head_dim, mixed
    dtypes or devices.
    """
    reason = _attention_fallback_reason(query, key, value, dropout_p=dropout_p, enable_gqa=enable_gqa)
    if reason is None and _torch_attention_runs(query, key, value, attn_mask, is_causal):
        reason = ""  # the answer is torch's op: torch's function, as called, nothing logged
    operand = _mask_operand(attn_mask, query, key, is_causal) if reason is None else reason
    if isinstance(operand, str):
        if operand:
            _fall_back(operand)
        return torch_functional.scaled_dot_product_attention(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
        )
    mask, causal = operand
    out: Tensor = torch.ops.tiletune.fused_attention(query, key, value, mask, causal=causal, scale=scale)[0]
    return out


def _torch_attention_runs(
    query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | CausalBias | None, is_causal: bool
) -> bool:
    """Whether torch's attention runs the call as made (its answer, and its backward's, are torch's):
    decided on the operator's key of the call, its mask as the operator would take it (made at
    the decision only); a ``CausalBias`` takes the operator's path."""
    if isinstance(attn_mask, CausalBias) or not _torch_may_run(query, key, value):
        return False
    masks = () if attn_mask is None else (attn_mask,)
    grad = _records_grad(query, key, value, *masks)
    layout = (
        "attention",
        is_causal,
        grad,
        *((t.shape, t.stride(), t.dtype, t.device) for t in (query, key, value, *masks)),
    )

    def calls() -> tuple[Call, ...]:
        operand = _mask_operand(attn_mask, query, key, is_causal)
        if isinstance(operand, str):
            raise ValueError(operand)  # not the operator's call: it falls back to torch's itself
        mask, causal = operand
        operator_masks = () if mask is None else (mask,)
        forward = Call("fused_attention", (query, key, value, *operator_masks), {"causal": causal})
        if not grad:
            return (forward,)
        out, grad_out = query.new_empty(query.shape), query.new_empty(query.shape)
        lse = query.new_empty(query.shape[:-1], dtype=torch.float32)
        saved = (query, key, value, out, lse, grad_out, *operator_masks)
        return forward, Call("fused_attention_backward", saved, {"causal": causal}, dtype_name(query.dtype))

    return runs_torch(layout, calls)


def rms_norm(x: Tensor, weight: Tensor, eps: float | None = EPS) -> Tensor:
    """``x / sqrt(mean(x^2, -1) + eps) * weight`` on ``torch.ops.tiletune.rms_norm``, at any ``eps``
    (the operator's argument, not part of its tuned key); ``None`` is ``torch.finfo(x.dtype).eps``,
    as in torch's ``rms_norm``. A weight of another dtype than ``x`` runs torch's ``rms_norm``."""
    with _outside_attention_mode(x, weight):
        return _rms_norm(x, weight, eps)


def _rms_norm(x: Tensor, weight: Tensor, eps: float | None) -> Tensor:
    if weight.dtype != x.dtype:
        _fall_back("rms_norm with a weight of another dtype than its input")
        return torch_functional.rms_norm(x, (x.shape[-1],), weight, eps)
    if _torch_rms_norm_runs(x, weight):
        return torch_functional.rms_norm(x, (x.shape[-1],), weight, eps)
    out: Tensor = torch.ops.tiletune.rms_norm(x, weight, torch.finfo(x.dtype).eps if eps is None else eps)
    return out


def _torch_rms_norm_runs(x: Tensor, weight: Tensor) -> bool:
    """Whether torch's ``rms_norm`` runs the call (its answer, and its backward's, are torch's)."""
    if not _torch_may_run(x, weight):
        return False
    grad = _records_grad(x, weight)
    layout = ("rms_norm", grad, x.shape, x.stride(), weight.shape, weight.stride(), x.dtype, x.device)

    def calls() -> tuple[Call, ...]:
        forward = Call("rms_norm", (x, weight))
        return (forward, Call("rms_norm_backward", (x, weight, x.new_empty(x.shape)))) if grad else (forward,)

    return runs_torch(layout, calls)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ weight^T + bias`` on ``torch.ops.tiletune.matmul`` (``x``'s leading dims flattened)."""
    with _outside_attention_mode(x, weight, *(() if bias is None else (bias,))):
        return _linear(x, weight, bias)


def _linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    if _torch_linear_runs(x, weight, bias):
        return torch_functional.linear(x, weight, bias)
    rows = x.reshape(-1, x.shape[-1])
    out: Tensor = torch.ops.tiletune.matmul(rows, weight.t())
    out = out.reshape(*x.shape[:-1], weight.shape[0])
    return out if bias is None else out + bias


def _torch_linear_runs(x: Tensor, weight: Tensor, bias: Tensor | None) -> bool:
    """Whether torch's ``linear`` runs the call (the answers of its ``matmul`` and, where autograd
    records it, of the backward's two ``matmul`` calls are torch's)."""
    if not _torch_may_run(x, weight, *(() if bias is None else (bias,))):
        return False
    grad = _records_grad(x, weight)
    layout = ("linear", grad, x.shape, x.stride(), weight.shape, weight.stride(), x.dtype, x.device)

    def calls() -> tuple[Call, ...]:
        rows, transposed = x.reshape(-1, x.shape[-1]), weight.t()
        forward = Call("matmul", (rows, transposed))
        if not grad:
            return (forward,)
        grad_out = rows.new_empty((rows.shape[0], transposed.shape[1]))
        products = gradient_products(rows, transposed, grad_out)
        return forward, *(Call("matmul", (a, b)) for a, b, _ in products)

    return runs_torch(layout, calls)
