"""``triton_fused_attention``: attention forward, FlashAttention-2 style, in Triton.

Its declaration (knobs, working set, default) is
:class:`~tiletune.kernels.fused_attention.declaration.TritonFusedAttentionDeclaration`;
inputs (``q [batch, heads, seq_q, head_dim]``, ``k``/``v [batch, heads,
seq_kv, head_dim]``) and reference (with ``causal``: key ``j > i`` masked,
top-left aligned) are ``fused_attention``'s. A program owns one ``block_q``
block of queries of one (batch, head) and loops over the ``block_kv`` blocks of
keys and values with the online softmax (float32 running max, sum and
accumulator; scores in base 2). The loop is pipelined by ``num_stages`` and
split in two: blocks wholly below the diagonal (and inside ``seq_kv``) run
without masks, the rest (with ``causal`` only up to the block's last query) with
them. ``head_dim`` is padded to a power of two (at least 16, for ``tl.dot``);
float32 uses full-precision dots.

Working set (shared memory on CUDA): the Q block and the K and V blocks of
every stage, ``(block_q + 2 * block_kv) * padded head_dim * element size *
num_stages``.

Default (the hand-written rule, ``total = seq_q * seq_kv``, one head's score
matrix): ``heuristic_tiling`` gives tile elements ``E``; ``block_q = block_kv =
pow2_floor(sqrt(E))`` snapped down to their knob values (16 at least); for
``total <= 1024`` both cover their dim. ``num_stages`` = the rule's depth (1
when one kv block covers ``seq_kv``), ``num_warps`` = 4 (see
:meth:`TritonSpec.launch_defaults`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.fused_attention.declaration import TritonFusedAttentionDeclaration
from tiletune.kernels.fused_attention.portable import FusedAttentionSpec
from tiletune.kernels.triton.spec import TritonSpec


class TritonFusedAttentionSpec(TritonFusedAttentionDeclaration, TritonSpec, FusedAttentionSpec):
    """FlashAttention-2 style forward in Triton: a q block per program, pipelined kv loop."""

    def run(
        self, inputs: Sequence[torch.Tensor], config: Config, shape: Shape, backend: str = "triton"
    ) -> torch.Tensor:
        """Attention by the Triton kernel."""
        kernels, options = self.prepare_launch(inputs, config, backend)
        b, h, d = shape["batch"], shape["heads"], shape["head_dim"]
        q, k, v = (t.reshape(b * h, t.shape[2], d).contiguous() for t in inputs)
        out = torch.empty_like(q)
        blocks = (config["block_q"], config["block_kv"])
        kernels.fused_attention(q, k, v, out, blocks, bool(shape["causal"]), options)
        return out.view(b, h, shape["seq_q"], d)


SPEC = TritonFusedAttentionSpec()
