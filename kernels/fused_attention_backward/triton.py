"""``triton_fused_attention_backward``: the attention's backward, FlashAttention-2 style, in Triton.

Its declaration (knobs, working set, default) is
:class:`~tiletune.kernels.fused_attention_backward.declaration.TritonFusedAttentionBackwardDeclaration`;
inputs, reference and ``shape_of`` are ``fused_attention_backward``'s: ``(q, k, v, out, lse,
grad_out)`` and, with ``mask=1``, the additive ``mask`` (q's dtype, ``[batch or 1, heads or 1, seq_q,
seq_kv]``, read through its strides); output ``(dq, dk, dv)`` in q's, k's and v's dtypes and sizes.

The kernels (:mod:`tiletune.kernels.triton.attention_backward_jit`, loaded on the first run) are three
launches: ``D = rowsum(grad_out * out) - grad_lse`` per query row; a dk/dv program per (batch, kv head,
``block_kv`` block of keys) looping the query heads of its group and the ``block_q`` blocks of queries
that see its keys (causal: from the first that does), ``P`` recomputed from ``lse``; a dq program per
(batch, head, ``block_q`` block of queries) over the ``block_kv`` blocks of keys its queries see. Both
accumulate in float32 and write each output block once (no atomics). ``num_stages`` pipelines both
inner loops; float32 uses full-precision dots; ``head_dim`` is padded to a power of two (>= 16).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.errors import ShapeError
from tiletune.kernels.fused_attention import formula as forward_formula
from tiletune.kernels.fused_attention_backward.declaration import TritonFusedAttentionBackwardDeclaration
from tiletune.kernels.fused_attention_backward.passes import Gradients
from tiletune.kernels.fused_attention_backward.portable import FusedAttentionBackwardSpec, expect_mask
from tiletune.kernels.triton.spec import TritonSpec

#: The module of its ``@triton.jit`` kernels, under ``tiletune.kernels.triton``.
KERNELS_MODULE = "attention_backward_jit"


class TritonFusedAttentionBackwardSpec(
    TritonFusedAttentionBackwardDeclaration, TritonSpec, FusedAttentionBackwardSpec
):
    """FlashAttention-2's backward in Triton: a dk/dv kernel over kv blocks, a dq kernel over q blocks."""

    def run(
        self, inputs: Sequence[torch.Tensor], config: Config, shape: Shape, backend: str = "triton"
    ) -> Gradients:
        """:meth:`gradients` with the default scale and no gradient of the log-sum-exp."""
        return self.gradients(inputs, config, shape, backend)

    def gradients(  # noqa: PLR0917  (as the portable spec's: the operator's autograd calls it positionally)
        self,
        inputs: Sequence[torch.Tensor],
        config: Config,
        shape: Shape,
        backend: str = "triton",
        scale: float | None = None,
        grad_lse: torch.Tensor | None = None,
    ) -> Gradients:
        """``(dq, dk, dv)`` by the Triton kernels for ``inputs`` (``q, k, v, out, lse, grad_out`` and,
        with ``shape["mask"]``, the mask).

        ``scale``: the forward's (None: ``head_dim ** -0.5``); ``grad_lse``: the gradient of the
        forward's log-sum-exp (``[batch, heads, seq_q]``), or None. ``shape["causal"]`` picks the
        alignment. Raises ``ValueError`` when the inputs do not hold the mask the shape declares,
        :class:`ShapeError` when ``grad_lse`` is not ``lse``'s size, and
        (through :meth:`prepare_launch`) when Triton cannot run on the inputs' device.
        """
        expect_mask(self.name, inputs, shape)
        kernels, options = self.prepare_launch(inputs, config, backend, module=KERNELS_MODULE)
        q, k, v, out, grad_out = (t.contiguous() for t in (*inputs[:4], inputs[5]))
        lse = inputs[4].contiguous()
        mask = inputs[6] if len(inputs) == 7 else None
        if grad_lse is not None:
            if grad_lse.shape != lse.shape:
                raise ShapeError(
                    "grad_lse", f"must be lse's size {list(lse.shape)}, got {list(grad_lse.shape)}"
                )
            grad_lse = grad_lse.to(device=q.device, dtype=torch.float32).contiguous()
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        kernels.fused_attention_backward(
            (q, k, v, out, lse),
            mask,
            (grad_out, grad_lse),
            (dq, dk, dv),
            (config["block_q"], config["block_kv"]),
            shape["causal"],
            forward_formula.scale_of(shape["head_dim"], scale),
            options,
        )
        return dq, dk, dv


SPEC = TritonFusedAttentionBackwardSpec()
