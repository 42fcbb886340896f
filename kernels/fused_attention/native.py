"""``native_fused_attention``: ``fused_attention`` in C++ (``kernels/native/csrc/attention.cpp``).

Its declaration (knobs, tile count) is
:class:`~tiletune.kernels.fused_attention.declaration.NativeFusedAttentionDeclaration`.

Knobs: ``fused_attention``'s (``block_q``, ``block_kv``, ``buffer_num``, ``pipeline_depth``)
and ``block_dim``. A tile is one q block of one (batch, head); tiles are dealt to the cores
round-robin (balancing the causal triangle); each kv step computes scores and ``P V`` with
single-threaded ``sgemm_`` and folds them in with the online softmax (AVX-512 ``exp``). The
scaled Q block and the accumulator have slots; K and V blocks are converted into float32 slots
for half/bfloat16 and read in place for float32 (already contiguous ``[block_kv, head_dim]``).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

import torch

from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.fused_attention.declaration import NativeFusedAttentionDeclaration
from tiletune.kernels.fused_attention.portable import FusedAttentionSpec
from tiletune.kernels.native.spec import NativeSpec


class NativeFusedAttentionSpec(NativeFusedAttentionDeclaration, NativeSpec, FusedAttentionSpec):
    """``fused_attention`` as a native CPU kernel."""

    def launch(
        self, module: ModuleType, inputs: Sequence[torch.Tensor], config: Config, shape: Shape
    ) -> torch.Tensor:
        """The extension's ``attention`` on ``[batch * heads, seq, head_dim]`` views."""
        b, h, d = shape["batch"], shape["heads"], shape["head_dim"]
        q, k, v = (t.reshape(b * h, t.shape[2], d) for t in inputs)
        out: torch.Tensor = module.attention(
            q,
            k,
            v,
            bool(shape["causal"]),
            config["block_q"],
            config["block_kv"],
            config["block_dim"],
            config["buffer_num"],
            config["pipeline_depth"],
        )
        return out.view(b, h, shape["seq_q"], d)


SPEC = NativeFusedAttentionSpec()
