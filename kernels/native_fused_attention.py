"""``native_fused_attention``: :mod:`~tiletune.kernels.fused_attention` in C++ (``csrc/attention.cpp``).

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

from tiletune.kernels.fused_attention import FusedAttentionSpec
from tiletune.kernels.native_spec import NativeSpec, with_block_dim
from tiletune.kernels.spec import Config, Shape


class NativeFusedAttentionSpec(NativeSpec, FusedAttentionSpec):
    """``fused_attention`` as a native CPU kernel."""

    name = "native_fused_attention"
    version = 1
    description = "attention forward, native CPU: (batch, head, q block) tiles over block_dim cores"
    portable = FusedAttentionSpec
    knobs = with_block_dim(FusedAttentionSpec.knobs)

    def tile_count(self, config: Config, shape: Shape) -> int:
        """``batch * heads * ceil(seq_q / block_q)``."""
        return shape["batch"] * shape["heads"] * -(-shape["seq_q"] // config["block_q"])

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
