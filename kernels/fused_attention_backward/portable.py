"""``fused_attention_backward``: the gradients ``(dq, dk, dv)`` of ``fused_attention``, FlashAttention-2
style: its portable implementation.

Its declaration (dims, knobs, working set, default rule, counts) is
:mod:`tiletune.kernels.fused_attention_backward.declaration`; its two tiled passes are
:mod:`~tiletune.kernels.fused_attention_backward.passes`; its reference is
:mod:`~tiletune.kernels.fused_attention_backward.formula`.

Inputs, in ``run``'s order: ``q [batch, heads, seq_q, d]``, ``k``, ``v [batch, kv_heads, seq_kv, d]``,
the forward's ``out`` (q's size and dtype) and ``lse`` (float32 ``[batch, heads, seq_q]``, natural
log, ``-inf`` for a row that sees no key), ``grad_out`` (the gradient of ``out``) and, with
``mask=1``, the additive ``mask`` (q's dtype, broadcasting to ``[batch, heads, seq_q, seq_kv]``).
Output: ``(dq, dk, dv)`` in q's, k's and v's dtype and shape.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.errors import ShapeError
from tiletune.kernels.fused_attention import formula as forward_formula
from tiletune.kernels.fused_attention.formula import AttentionSaved
from tiletune.kernels.fused_attention.portable import SPEC as FORWARD
from tiletune.kernels.fused_attention_backward import formula, vendor
from tiletune.kernels.fused_attention_backward.declaration import FusedAttentionBackwardDeclaration
from tiletune.kernels.fused_attention_backward.passes import Gradients, tiled_gradients
from tiletune.kernels.native.space import NATIVE_BACKEND
from tiletune.kernels.native.spec import native_backends
from tiletune.kernels.pipeline import require_backend
from tiletune.kernels.spec import KernelSpec, VendorOp, expect_inputs, expect_ndim, expect_size

#: The inputs' names, in ``run``'s order (``mask`` only with ``mask=1``).
INPUT_NAMES = ("q", "k", "v", "out", "lse", "grad_out", "mask")


def _expect_like(name: str, tensor: torch.Tensor, like: torch.Tensor, like_name: str, ndim: int) -> None:
    """Raise :class:`ShapeError` naming ``name`` unless its first ``ndim`` sizes are ``like``'s."""
    layout = "[batch, heads, seq_q" + (", head_dim]" if ndim == 4 else "]")
    expect_ndim(name, tensor, ndim, layout)
    for index in range(ndim):
        expect_size(name, tensor.shape[index], like.shape[index], f"its dim {index} (as {like_name}'s)")


class FusedAttentionBackwardSpec(FusedAttentionBackwardDeclaration, KernelSpec):
    """The attention's backward: a dk/dv pass over kv blocks, a dq pass over q blocks."""

    def backends(self) -> tuple[str, ...]:
        """``torch`` (portable), and ``native`` (the C++ CPU kernel) where it is built here."""
        return native_backends()

    def shape_of(self, inputs: Sequence[torch.Tensor]) -> Shape:
        """The forward's shape, read from ``q``, ``k``, ``v`` (and the ``mask``, a seventh input), after
        checking ``out`` and ``grad_out`` (q's size and dtype) and ``lse`` (float32 ``[batch, heads,
        seq_q]``): :class:`ShapeError` naming the input at fault. ``causal`` is 0 (the caller passes it)."""
        names = INPUT_NAMES if len(inputs) == 7 else INPUT_NAMES[:6]
        expect_inputs(self.name, inputs, names)
        q, k, v, out, lse, grad_out = inputs[:6]
        shape = FORWARD.shape_of([q, k, v, *inputs[6:]])
        for name, tensor in (("out", out), ("grad_out", grad_out)):
            _expect_like(name, tensor, q, "q", 4)
            if tensor.dtype != q.dtype:
                raise ShapeError(f"inputs.{name}", f"must have q's dtype ({q.dtype}), got {tensor.dtype}")
        _expect_like("lse", lse, q, "q", 3)
        if lse.dtype != torch.float32:
            raise ShapeError("inputs.lse", f"must be float32 (the forward's log-sum-exp), got {lse.dtype}")
        return shape

    def make_inputs(
        self, shape: Shape, dtype: str, device: torch.device, seed: int = 0
    ) -> tuple[torch.Tensor, ...]:
        """``q``, ``k``, ``v`` (and the mask) as ``fused_attention``'s inputs of ``seed``; ``out`` (in
        their dtype) and ``lse`` (float32) from the forward's formula; ``grad_out`` standard normal."""
        forward_shape = {name: shape[name] for name in (dim.name for dim in FORWARD.dims)}
        q, k, v, *mask = FORWARD.make_inputs(forward_shape, dtype, device, seed)
        out, lse = forward_formula.attention(q, k, v, mask=mask[0] if mask else None, causal=shape["causal"])
        generator = torch.Generator().manual_seed(seed * 1_000_003 + 17)
        grad_out = torch.randn(tuple(q.shape), generator=generator).to(device, q.dtype)
        return (q, k, v, out.to(q.dtype), lse.float(), grad_out, *mask)

    def vendor(self, shape: Shape, device_kind: str) -> VendorOp | None:
        """torch's fused attention backward on CPUs
        (:mod:`tiletune.kernels.fused_attention_backward.vendor`)."""
        return vendor.gradients_only(shape, device_kind)

    def reference(self, inputs: Sequence[torch.Tensor], shape: Shape) -> Gradients:
        """``(dq, dk, dv)`` by the formula (:func:`~tiletune.kernels.fused_attention_backward.formula.
        gradients`) in float32 (float64 for float64)."""
        q, k, v, out, lse, grad_out = inputs[:6]
        mask = inputs[6] if len(inputs) == 7 else None
        saved = AttentionSaved(q, k, v, mask, out, lse, shape["causal"], None)
        result = formula.gradients(saved, grad_out)
        return result.dq, result.dk, result.dv

    def run(
        self, inputs: Sequence[torch.Tensor], config: Config, shape: Shape, backend: str = "torch"
    ) -> Gradients:
        """:meth:`gradients` with the default scale and no gradient of the log-sum-exp."""
        return self.gradients(inputs, config, shape, backend)

    def gradients(  # noqa: PLR0917  (the operator's autograd calls it positionally)
        self,
        inputs: Sequence[torch.Tensor],
        config: Config,
        shape: Shape,
        backend: str = "torch",
        scale: float | None = None,
        grad_lse: torch.Tensor | None = None,
    ) -> Gradients:
        """``(dq, dk, dv)`` of ``inputs`` (``q, k, v, out, lse, grad_out`` and, with ``mask``, the mask)
        under ``config``: the two tiled passes (``native``: the C++ kernel).

        ``scale``: the forward's (None: ``head_dim ** -0.5``); ``grad_lse``: the gradient of the
        forward's log-sum-exp output (``[batch, heads, seq_q]``), or None. Raises ``ValueError`` for
        an unknown backend or inputs that do not hold the mask the shape declares.
        """
        if backend == NATIVE_BACKEND:
            from tiletune.kernels.fused_attention_backward.native import SPEC as NATIVE

            return NATIVE.gradients(inputs, config, shape, NATIVE_BACKEND, scale, grad_lse)
        require_backend(self.backends(), backend)
        expect_mask(self.name, inputs, shape)
        return tiled_gradients(
            inputs, config, shape, forward_formula.scale_of(shape["head_dim"], scale), grad_lse
        )


def expect_mask(kernel: str, inputs: Sequence[torch.Tensor], shape: Shape) -> None:
    """Raise ``ValueError`` unless ``inputs`` are 7 tensors with ``shape["mask"]`` and 6 without."""
    expected = 7 if shape.get("mask", 0) else 6
    if len(inputs) != expected:
        raise ValueError(
            f"{kernel}: the shape (mask={shape.get('mask', 0)}) takes {expected} inputs "
            f"({', '.join(INPUT_NAMES[:expected])}), got {len(inputs)}"
        )


SPEC = FusedAttentionBackwardSpec()
