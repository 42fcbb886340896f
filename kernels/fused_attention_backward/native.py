"""``native_fused_attention_backward``: ``fused_attention_backward`` in C++
(``kernels/native/csrc/attention_backward.cpp``).

Its declaration (knobs, tile count) is
:class:`~tiletune.kernels.fused_attention_backward.declaration.NativeFusedAttentionBackwardDeclaration`.

Knobs: ``block_q``, ``block_kv`` (one pair for both passes), ``block_dim``, ``buffer_num``,
``pipeline_depth``. ``D = rowsum(dO * O) - dlse`` first (rows split over the cores); then the kv
pass: a tile is one kv block of one (batch, kv head), its steps the (query head of the group, q
block) pairs that see it, accumulating ``dk`` and ``dv`` in float32. ``dq`` comes from the same
pass when each core can own whole (batch, kv head) units without leaving the cores unbalanced
(five block products per pair: ``dq += dS K`` into the unit's rows, which no other core writes),
else from a second pass over q blocks (the forward's tiles, recomputing ``P`` and ``dS``). The
streamed blocks (Q and dO in the kv pass, K and V in the q pass) are converted into float32 slots
rotating over ``buffer_num`` for half types and read in place for float32; the accumulators
rotate over ``buffer_num`` slots; the blocks of the step ``pipeline_depth - 1`` ahead are
prefetched. Block products: single-threaded ``sgemm_``; ``exp``: AVX-512.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

import torch

from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.fused_attention import formula
from tiletune.kernels.fused_attention_backward.declaration import NativeFusedAttentionBackwardDeclaration
from tiletune.kernels.fused_attention_backward.passes import Gradients
from tiletune.kernels.fused_attention_backward.portable import FusedAttentionBackwardSpec, expect_mask
from tiletune.kernels.native.space import NATIVE_BACKEND
from tiletune.kernels.native.spec import NativeSpec


class NativeFusedAttentionBackwardSpec(
    NativeFusedAttentionBackwardDeclaration, NativeSpec, FusedAttentionBackwardSpec
):
    """``fused_attention_backward`` as a native CPU kernel."""

    #: ``launch`` makes the tensors contiguous itself and reads the mask through its strides.
    keeps_layout = True

    def launch(  # type: ignore[override]  # a backward kernel's result is its gradients
        self, module: ModuleType, inputs: Sequence[torch.Tensor], config: Config, shape: Shape
    ) -> Gradients:
        """The extension's ``attention_backward`` on the inputs (default scale, no ``grad_lse``)."""
        return self._backward(module, inputs, config, shape, None, None)

    def run(  # type: ignore[override]  # a backward kernel's result is its gradients
        self, inputs: Sequence[torch.Tensor], config: Config, shape: Shape, backend: str = NATIVE_BACKEND
    ) -> Gradients:
        """:meth:`gradients` with the default scale and no gradient of the log-sum-exp."""
        return self.gradients(inputs, config, shape, backend)

    def gradients(  # noqa: PLR0917  (the operator's autograd calls it positionally)
        self,
        inputs: Sequence[torch.Tensor],
        config: Config,
        shape: Shape,
        backend: str = NATIVE_BACKEND,
        scale: float | None = None,
        grad_lse: torch.Tensor | None = None,
    ) -> Gradients:
        """``(dq, dk, dv)`` of ``(q, k, v, out, lse, grad_out[, mask])`` on the CPU.

        Shapes and dtypes as the portable kernel's (``lse`` float32, the mask additive in q's dtype,
        passed as is; the others are made contiguous). ``scale`` None is ``head_dim ** -0.5``;
        ``grad_lse`` (``[batch, heads, seq_q]``) is the gradient of the forward's log-sum-exp. A
        config without ``block_dim`` gets the default cores.

        Raises :class:`DeviceUnavailableError` when the extension is not built here, ``ValueError``
        for an unknown backend, tensors off the CPU or a mask the shape does not declare, and
        ``RuntimeError`` (the extension's checks) for inconsistent tensors.
        """
        expect_mask(self.name, inputs, shape)
        module, config = self.prepare(inputs, config, shape, backend)
        return self._backward(module, inputs, config, shape, scale, grad_lse)

    def _backward(  # noqa: PLR0917  (the extension's arguments)
        self,
        module: ModuleType,
        inputs: Sequence[torch.Tensor],
        config: Config,
        shape: Shape,
        scale: float | None,
        grad_lse: torch.Tensor | None,
    ) -> Gradients:
        """Call the extension: contiguous tensors, the mask (if any) as it is."""
        q, k, v, out, lse, grad_out = (t.contiguous() for t in inputs[:6])
        mask = inputs[6] if len(inputs) == 7 else None
        result: Gradients = module.attention_backward(
            q,
            k,
            v,
            mask,
            out,
            lse,
            grad_out,
            grad_lse,
            int(shape.get("causal", 0)),
            formula.scale_of(shape["head_dim"], scale),
            config["block_q"],
            config["block_kv"],
            config["block_dim"],
            config["buffer_num"],
            config["pipeline_depth"],
        )
        return result


SPEC = NativeFusedAttentionBackwardSpec()
