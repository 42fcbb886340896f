"""``native_fused_attention``: ``fused_attention`` in C++ (``kernels/native/csrc/attention.cpp``).

Its declaration (knobs, tile count) is
:class:`~tiletune.kernels.fused_attention.declaration.NativeFusedAttentionDeclaration`.

Knobs: ``fused_attention``'s (``block_q``, ``block_kv``, ``buffer_num``, ``pipeline_depth``)
and ``block_dim``. A tile is one q block of one (batch, head); tiles are dealt to the cores
round-robin (balancing the causal triangle); each kv step computes scores and ``P V`` with
single-threaded ``sgemm_`` and folds them in with the online softmax (AVX-512 ``exp``). The
scaled Q block and the accumulator have slots; K and V blocks are converted into float32 slots
for half/bfloat16 and read in place for float32 (already contiguous ``[block_kv, head_dim]``).

Features: grouped-query attention (``kv_heads`` dividing ``heads``; k and v are never repeated),
``causal`` 0 (none), 1 (top-left aligned) or 2 (bottom-right aligned), an optional additive
mask in q's dtype broadcasting to ``[batch, heads, seq_q, seq_kv]`` (read through its strides,
never copied), a ``scale`` of ``q k^T``, and the float32 natural-log log-sum-exp of each query
row besides the output. A query row that sees no key gets output 0 and log-sum-exp ``-inf``.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

import torch

from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.fused_attention.declaration import NativeFusedAttentionDeclaration
from tiletune.kernels.fused_attention.portable import FusedAttentionSpec
from tiletune.kernels.native.space import NATIVE_BACKEND
from tiletune.kernels.native.spec import NativeSpec


class NativeFusedAttentionSpec(NativeFusedAttentionDeclaration, NativeSpec, FusedAttentionSpec):
    """``fused_attention`` as a native CPU kernel."""

    #: ``launch`` makes q, k and v contiguous itself and reads the mask through its strides.
    keeps_layout = True

    def launch(
        self, module: ModuleType, inputs: Sequence[torch.Tensor], config: Config, shape: Shape
    ) -> torch.Tensor:
        """The extension's ``attention`` on ``(q, k, v)`` or ``(q, k, v, mask)``: the output only
        (the scale ``head_dim ** -0.5``)."""
        return self._attention(module, inputs, config, shape, None)[0]

    def attend(
        self,
        inputs: Sequence[torch.Tensor],
        config: Config,
        shape: Shape,
        backend: str = NATIVE_BACKEND,
        scale: float | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(out, lse)`` of ``(q, k, v)`` or ``(q, k, v, mask)`` on the CPU.

        ``q [batch, heads, seq_q, head_dim]``, ``k`` and ``v [batch, kv_heads, seq_kv,
        head_dim]``, one dtype; the mask, additive in q's dtype, broadcasts to ``[batch,
        heads, seq_q, seq_kv]`` and is passed as is (q, k and v are made contiguous).
        ``shape["causal"]``: 0, 1 (top-left) or 2 (bottom-right aligned). ``scale`` (default
        ``head_dim ** -0.5``) multiplies ``q k^T``. ``out`` has q's dtype and shape; ``lse
        [batch, heads, seq_q]`` is float32, natural log, ``-inf`` for rows that see no key
        (whose ``out`` is 0). A config without ``block_dim`` gets the default cores.

        Raises :class:`DeviceUnavailableError` when the extension is not built here,
        ``ValueError`` for an unknown backend, tensors off the CPU or a mask the shape does
        not declare, and ``RuntimeError`` (the extension's checks) for inconsistent tensors.
        """
        module, config = self.prepare(inputs, config, shape, backend)
        return self._attention(module, inputs, config, shape, scale)

    def _attention(
        self,
        module: ModuleType,
        inputs: Sequence[torch.Tensor],
        config: Config,
        shape: Shape,
        scale: float | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Call the extension: contiguous q, k, v; the mask (if any) as it is."""
        if len(inputs) not in (3, 4):
            raise ValueError(
                f"{self.name}: inputs are (q, k, v) or (q, k, v, mask), got {len(inputs)} tensors"
            )
        mask = inputs[3] if len(inputs) == 4 else None
        if shape.get("mask", 0) and mask is None:
            raise ValueError(f"{self.name}: the shape declares a mask but none was given")
        q, k, v = (t.contiguous() for t in inputs[:3])
        result: tuple[torch.Tensor, torch.Tensor] = module.attention(
            q,
            k,
            v,
            mask,
            int(shape.get("causal", 0)),
            shape["head_dim"] ** -0.5 if scale is None else float(scale),
            config["block_q"],
            config["block_kv"],
            config["block_dim"],
            config["buffer_num"],
            config["pipeline_depth"],
        )
        return result


SPEC = NativeFusedAttentionSpec()
