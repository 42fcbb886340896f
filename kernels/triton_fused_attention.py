"""``triton_fused_attention``: attention forward, FlashAttention-2 style, in Triton.

Dims, inputs (``q [batch, heads, seq_q, head_dim]``, ``k``/``v [batch, heads,
seq_kv, head_dim]``), reference (with ``causal``: key ``j > i`` masked, top-left
aligned) and counts are ``fused_attention``'s. A program owns one ``block_q``
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

import math
from collections.abc import Sequence

import torch

from tiletune.client.space import pow2_ceil, snap_down
from tiletune.kernels.fused_attention import FusedAttentionSpec
from tiletune.kernels.spec import Config, DeviceLimits, Shape, element_size, heuristic_tiling, pow2_floor
from tiletune.kernels.triton_spec import NUM_STAGES, NUM_WARPS, TritonSpec, block_knob

BLOCKS = tuple(1 << p for p in range(4, 9))


def padded_head_dim(head_dim: int) -> int:
    """``head_dim`` as the kernel holds it: the next power of two, at least 16."""
    return max(16, pow2_ceil(head_dim))


class TritonFusedAttentionSpec(TritonSpec, FusedAttentionSpec):
    """FlashAttention-2 style forward in Triton: a q block per program, pipelined kv loop."""

    name = "triton_fused_attention"
    version = 1
    description = "fused_attention in Triton: FlashAttention-2 forward, q block per program, kv loop"
    knobs = (
        block_knob("block_q", BLOCKS, "queries per program (a power of two, >= 16)", clamp_to="seq_q"),
        block_knob(
            "block_kv", BLOCKS, "keys/values per loop step (a power of two, >= 16)", clamp_to="seq_kv"
        ),
        NUM_STAGES,
        NUM_WARPS,
    )

    def working_set_bytes(self, config: Config, shape: Shape, dtype: str) -> int:
        """The Q block and the K and V blocks of every stage in flight."""
        rows = config["block_q"] + 2 * config["block_kv"]
        return rows * padded_head_dim(shape["head_dim"]) * element_size(dtype) * config["num_stages"]

    def loop_steps(self, config: Config, shape: Shape) -> int:
        """kv blocks of the longest program (causal: the last q block's)."""
        return -(-shape["seq_kv"] // config["block_kv"])

    def default_config(self, shape: Shape, dtype: str, limits: DeviceLimits) -> Config:
        """Square blocks of the rule's tile elements (whole dims for tiny problems)."""
        total = shape["seq_q"] * shape["seq_kv"]
        rule = heuristic_tiling(total, element_size(dtype), limits.local_memory_bytes)
        values = self.knob_values(shape)
        side = pow2_floor(math.sqrt(rule.tile_elements))
        small = total <= 1024  # the rule's "one tile of everything"
        blocks = {
            knob: values[knob][-1] if small else snap_down(side, values[knob])
            for knob in ("block_q", "block_kv")
        }
        return {**blocks, **self.launch_defaults(rule, self.loop_steps(blocks, shape), limits)}

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
