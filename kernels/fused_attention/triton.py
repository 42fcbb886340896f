"""``triton_fused_attention``: attention forward, FlashAttention-2 style, in Triton.

Its declaration (knobs, working set, default) is
:class:`~tiletune.kernels.fused_attention.declaration.TritonFusedAttentionDeclaration`;
inputs and reference are ``fused_attention``'s: ``q [batch, heads, seq_q, head_dim]``, ``k``/``v
[batch, kv_heads, seq_kv, head_dim]`` (grouped-query attention: query head ``h`` reads kv head ``h //
(heads // kv_heads)``) and, with ``mask=1``, an additive ``mask [batch or 1, heads or 1, seq_q,
seq_kv]`` in q's dtype, read through its strides (size-1 dims broadcast). ``causal``: 0 none, 1 key
``j > i`` masked (top-left aligned), 2 key ``j > i + seq_kv - seq_q`` masked (bottom-right aligned).
Scores are ``q k^T * scale`` (``scale`` defaults to ``head_dim ** -0.5``) plus the mask.

A program owns one ``block_q`` block of queries of one (batch, head) and loops over the
``block_kv`` blocks of keys and values with the online softmax (float32 running max, sum and
accumulator; scores in base 2, so the mask is added times ``log2(e)``). The loop is pipelined by
``num_stages`` and split in two: blocks wholly visible to every query of the block (and inside
``seq_kv``) run without masks, the rest (with ``causal`` only up to the block's last visible key;
blocks after it are skipped) with them; with a mask every block is masked. ``head_dim`` is padded
to a power of two (at least 16, for ``tl.dot``); float32 uses full-precision dots.

:meth:`TritonFusedAttentionSpec.attend` returns the output and the float32 ``lse [batch, heads,
seq_q]``, the natural-log log-sum-exp of each row's scaled, masked scores (what a backward pass
needs); a row that sees no key gets output 0 and ``lse`` ``-inf`` (no NaN). ``run`` returns the
output only.

Working set (shared memory on CUDA): the Q block and the K and V blocks (and
with a mask its ``block_q x block_kv`` block) of every stage, ``((block_q + 2 *
block_kv) * padded head_dim [+ block_q * block_kv]) * element size * num_stages``.

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
from tiletune.kernels.spec import expect_inputs
from tiletune.kernels.triton.spec import TritonSpec


class TritonFusedAttentionSpec(TritonFusedAttentionDeclaration, TritonSpec, FusedAttentionSpec):
    """FlashAttention-2 style forward in Triton: a q block per program, pipelined kv loop."""

    def attend(
        self,
        inputs: Sequence[torch.Tensor],
        config: Config,
        shape: Shape,
        backend: str = "triton",
        scale: float | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(out, lse)`` by the Triton kernel for inputs ``(q, k, v)`` or ``(q, k, v, mask)``.

        ``out`` has q's size and dtype, ``lse`` is float32 ``[batch, heads, seq_q]``; ``scale``
        None is ``head_dim ** -0.5``. ``shape["causal"]`` picks the alignment (0, 1 or 2); the
        inputs hold the mask exactly when ``shape["mask"]`` is 1 (a shape without it: no mask).
        """
        expect_inputs(self.name, inputs, ("q", "k", "v", "mask") if shape.get("mask") else ("q", "k", "v"))
        kernels, options = self.prepare_launch(inputs, config, backend)
        q, k, v = (t.contiguous() for t in inputs[:3])
        mask = inputs[3] if len(inputs) > 3 else None
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
        blocks = (config["block_q"], config["block_kv"])
        scale = shape["head_dim"] ** -0.5 if scale is None else scale
        kernels.fused_attention(q, k, v, mask, out, lse, blocks, shape["causal"], scale, options)
        return out, lse

    def run(
        self, inputs: Sequence[torch.Tensor], config: Config, shape: Shape, backend: str = "triton"
    ) -> torch.Tensor:
        """Attention by the Triton kernel: :meth:`attend`'s output."""
        return self.attend(inputs, config, shape, backend)[0]


SPEC = TritonFusedAttentionSpec()
