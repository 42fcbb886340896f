"""``fused_attention``'s declaration: ``O = softmax(scale * Q K^T + mask) V``, FlashAttention-2 style.

Inputs ``q [batch, heads, seq_q, head_dim]``, ``k`` and ``v [batch, kv_heads, seq_kv, head_dim]``
(grouped-query attention: query head ``h`` reads kv head ``h / (heads / kv_heads)``; MQA is
``kv_heads = 1``), and with ``mask=1`` an additive mask ``[batch or 1, heads or 1, seq_q, seq_kv]``
in q's dtype. ``causal=1`` masks key ``j > i`` for query ``i`` (top-left aligned, like
``scaled_dot_product_attention(is_causal=True)``); ``causal=2`` masks ``j > i + seq_kv - seq_q``
(bottom-right aligned, like FlashAttention-2 and torch's ``causal_lower_right``: the last query
sees every key, as in a chunked prefill). ``scale`` (default ``1 / sqrt(head_dim)``) is a call
argument, not a dim: it does not change the tiling. The forward also gives each query row's
log-sum-exp (float32, natural log), which the backward recomputes the probabilities from.

Tiling: an output tile is one ``block_q`` block of queries; its steps are the
``block_kv`` blocks of keys and values it attends to (with ``causal``, blocks
entirely after the block's last visible key are skipped, and the one crossing it is cut
there). A step copies the K and V blocks in (and the mask block, with ``mask``;
on a tile's first step, the Q block), computes the scores, and folds
them into the tile's float32 accumulator with the online softmax (running row
max and sum; the accumulator is rescaled when the max grows). The last step
divides by the sum; copy-out writes the block of ``O``. The working set is
counted per (batch, head), which is what one core holds when cores split
batch x heads.

Working set per (batch, head): ``buffer_num * (block_q + 2 * block_kv) *
head_dim * element size`` (Q, K, V queues) ``+ buffer_num * block_q *
head_dim * 4`` (accumulators, the output queue) ``+ (block_q * block_kv + 4 *
block_q) * 4`` (scores and row statistics) ``+`` for float16/bfloat16 the
float32 copies of the Q, K and V blocks the compute stage works on ``+`` with
``mask``, ``buffer_num`` mask blocks of ``block_q * block_kv`` elements.

Default (the hand-written rule, ``total = seq_q * seq_kv``, the score matrix
of one head): ``heuristic_tiling`` gives tile elements ``E``; ``block_q =
block_kv = pow2_floor(sqrt(E))``, each snapped down to its knob values;
buffers and depth as the rule says. For ``total <= 1024`` both blocks take
their whole dim.

Version 2 added ``kv_heads`` (default: ``heads``), ``mask`` (default 0) and ``causal=2``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from tiletune.client.space import DeviceLimits, Dim, Knob, pow2_ceil, snap_down
from tiletune.kernels.declaration import (
    BUFFER_NUM,
    FLOAT32_BYTES,
    PIPELINE_DEPTH,
    Config,
    KernelDeclaration,
    Shape,
    element_size,
    float32_copies,
    heuristic_tiling,
    pow2_floor,
)
from tiletune.kernels.errors import ShapeError
from tiletune.kernels.native.space import PORTABLE_AND_NATIVE, NativeDeclaration, with_block_dim
from tiletune.kernels.triton.space import NUM_STAGES, NUM_WARPS, TritonDeclaration, block_knob

BLOCKS = tuple(1 << p for p in range(4, 11))
#: ``triton_fused_attention``'s block sizes.
TRITON_BLOCKS = tuple(1 << p for p in range(4, 9))


def padded_head_dim(head_dim: int) -> int:
    """``head_dim`` as the Triton kernel holds it: the next power of two, at least 16."""
    return max(16, pow2_ceil(head_dim))


#: ``causal``'s values: none, top-left aligned, bottom-right aligned.
NO_CAUSAL, CAUSAL_TOP_LEFT, CAUSAL_BOTTOM_RIGHT = CAUSAL_CHOICES = (0, 1, 2)


def visible_keys(query: int, seq_q: int, seq_kv: int, causal: int) -> int:
    """How many keys (from key 0) query ``query`` may see under ``causal`` (before any mask)."""
    if causal == CAUSAL_TOP_LEFT:
        return max(0, min(seq_kv, query + 1))
    if causal == CAUSAL_BOTTOM_RIGHT:
        return max(0, min(seq_kv, query + 1 + seq_kv - seq_q))
    return seq_kv


def visible_pairs(seq_q: int, seq_kv: int, causal: int) -> int:
    """The (query, key) pairs a causal mask leaves, summed in closed form: query ``i`` sees
    ``clamp(i + c, 0, seq_kv)`` keys, ``c`` = 1 top-left, ``1 + seq_kv - seq_q`` bottom-right."""

    def up_to(n: int) -> int:  # sum of min(x, seq_kv) for x = 1..n
        if n <= 0:
            return 0
        if n <= seq_kv:
            return n * (n + 1) // 2
        return seq_kv * (seq_kv + 1) // 2 + (n - seq_kv) * seq_kv

    c = 1 if causal == CAUSAL_TOP_LEFT else 1 + seq_kv - seq_q
    return up_to(c + seq_q - 1) - up_to(c - 1)


def check_kv_heads(shape: Shape) -> Shape:
    """``shape``, once ``kv_heads`` divides ``heads`` (each kv head serves a group of query heads);
    :class:`ShapeError` naming ``shape.kv_heads`` otherwise."""
    if shape["heads"] % shape["kv_heads"]:
        raise ShapeError("shape.kv_heads", f"must divide heads ({shape['heads']}), got {shape['kv_heads']}")
    return shape


class FusedAttentionDeclaration(KernelDeclaration):
    """Tiled attention forward with online softmax over kv blocks."""

    name = "fused_attention"
    has_vendor = True
    backward_kernel = "fused_attention_backward"
    version = 2
    description = "attention forward, FlashAttention-2 style: q blocks x kv blocks with online softmax"
    dims = (
        Dim("batch", "batch size"),
        Dim("heads", "query heads"),
        Dim(
            "kv_heads",
            "key/value heads (grouped-query attention: heads / kv_heads query heads share one)",
            default="heads",
        ),
        Dim("seq_q", "query length"),
        Dim("seq_kv", "key/value length"),
        Dim("head_dim", "features per head"),
        Dim(
            "causal",
            "0: none; 1: query i attends keys j <= i (top-left); 2: j <= i + seq_kv - seq_q (bottom-right)",
            choices=CAUSAL_CHOICES,
        ),
        Dim("mask", "1: an additive mask [batch|1, heads|1, seq_q, seq_kv] joins the scores", (0, 1), 0),
    )
    knobs: tuple[Knob, ...] = (
        Knob("block_q", BLOCKS, "queries per output tile", clamp_to="seq_q"),
        Knob("block_kv", BLOCKS, "keys/values per step", clamp_to="seq_kv"),
        BUFFER_NUM,
        PIPELINE_DEPTH,
    )
    implementations: tuple[str, ...] = PORTABLE_AND_NATIVE

    def parse_shape(self, raw: Mapping[str, object]) -> Shape:
        """The base checks, and ``kv_heads`` must divide ``heads`` (:func:`check_kv_heads`)."""
        return check_kv_heads(super().parse_shape(raw))

    def working_set_bytes(self, config: Config, shape: Shape, dtype: str) -> int:
        """Per (batch, head): Q/K/V queues, float32 accumulators, scores and row statistics."""
        bq, bkv, buffers, d = config["block_q"], config["block_kv"], config["buffer_num"], shape["head_dim"]
        blocks = (bq + 2 * bkv) * d
        queues = buffers * blocks * element_size(dtype)
        accumulators = buffers * bq * d * FLOAT32_BYTES
        state = (bq * bkv + 4 * bq) * FLOAT32_BYTES
        upcast = 0 if element_size(dtype) >= FLOAT32_BYTES else blocks * FLOAT32_BYTES
        masks = buffers * bq * config["block_kv"] * element_size(dtype) if shape.get("mask") else 0
        return queues + accumulators + state + upcast + masks

    def default_config(self, shape: Shape, dtype: str, limits: DeviceLimits) -> Config:
        """Square blocks of the rule's tile elements (whole dims for tiny problems)."""
        total = shape["seq_q"] * shape["seq_kv"]
        rule = heuristic_tiling(total, element_size(dtype), limits.local_memory_bytes)
        values = self.knob_values(shape)
        side = pow2_floor(math.sqrt(rule.tile_elements))
        small = total <= 1024  # the rule's "one tile of everything"
        return {
            "block_q": snap_down(shape["seq_q"] if small else side, values["block_q"]),
            "block_kv": snap_down(shape["seq_kv"] if small else side, values["block_kv"]),
            "buffer_num": rule.buffer_num,
            "pipeline_depth": rule.pipeline_depth,
        }

    def flops(self, shape: Shape) -> float:
        """Two matmuls of ``seq_q x seq_kv x head_dim`` per (batch, head) over the visible keys."""
        b, h, sq, skv, d = (shape[n] for n in ("batch", "heads", "seq_q", "seq_kv", "head_dim"))
        causal = shape["causal"]
        if causal == NO_CAUSAL:
            return 4.0 * b * h * sq * skv * d
        return 4.0 * b * h * visible_pairs(sq, skv, causal) * d

    def bytes_moved(self, shape: Shape, dtype: str) -> float:
        """Read Q, K, V (and the mask, as broadcast: counted whole) once and write O once."""
        b, h, hkv, sq, skv, d = (
            shape[n] for n in ("batch", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim")
        )
        mask = b * h * sq * skv if shape.get("mask") else 0
        return float(((2 * h * sq + 2 * hkv * skv) * d * b + mask) * element_size(dtype))

    def tensor_bytes(self, shape: Shape, dtype: str) -> dict[str, int]:
        """``q`` and ``out`` (``batch x heads x seq_q x head_dim``), ``k`` and ``v`` (``batch x kv_heads
        x seq_kv x head_dim``), ``lse`` (float32 ``batch x heads x seq_q``), and with ``mask`` the mask
        at its largest (``batch x heads x seq_q x seq_kv``)."""
        b, h, hkv, sq, skv, d = (
            shape[n] for n in ("batch", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim")
        )
        queries, keys = b * h * sq * d * element_size(dtype), b * hkv * skv * d * element_size(dtype)
        tensors = {"q": queries, "k": keys, "v": keys, "out": queries, "lse": b * h * sq * FLOAT32_BYTES}
        if shape.get("mask"):
            tensors["mask"] = b * h * sq * skv * element_size(dtype)
        return tensors

    def workspace_bytes(self, shape: Shape, dtype: str) -> dict[str, int]:
        """The reference's float32 result, its two float32 score matrices (``seq_q x seq_kv`` per
        batch and head: the scores, then the probabilities) and its float32 copies of q, k, v
        (k and v at ``heads``: the reference repeats them for grouped-query attention)."""
        b, h, sq, skv, d = (shape[n] for n in ("batch", "heads", "seq_q", "seq_kv", "head_dim"))
        scores = b * h * sq * skv * FLOAT32_BYTES
        return {
            **float32_copies(dtype, q=b * h * sq * d, k=b * h * skv * d, v=b * h * skv * d),
            "scores": scores,
            "probabilities": scores,
            "reference": b * h * sq * d * FLOAT32_BYTES,
        }


class NativeFusedAttentionDeclaration(NativeDeclaration, FusedAttentionDeclaration):
    """``native_fused_attention``: ``fused_attention``'s q blocks of every (batch, head) spread over
    ``block_dim`` cores (``kernels/native/csrc/attention.cpp``)."""

    name = "native_fused_attention"
    backward_kernel = "native_fused_attention_backward"
    version = 2
    description = "attention forward, native CPU: (batch, head, q block) tiles over block_dim cores"
    portable = FusedAttentionDeclaration
    knobs = with_block_dim(FusedAttentionDeclaration.knobs)

    def tile_count(self, config: Config, shape: Shape) -> int:
        """``batch * heads * ceil(seq_q / block_q)``."""
        return shape["batch"] * shape["heads"] * -(-shape["seq_q"] // config["block_q"])


class TritonFusedAttentionDeclaration(TritonDeclaration, FusedAttentionDeclaration):
    """``triton_fused_attention``: a q block per program, pipelined kv loop (see
    ``kernels/fused_attention/triton.py``)."""

    name = "triton_fused_attention"
    backward_kernel = "triton_fused_attention_backward"
    version = 2
    description = "fused_attention in Triton: FlashAttention-2 forward, q block per program, kv loop"
    knobs = (
        block_knob("block_q", TRITON_BLOCKS, "queries per program (a power of two, >= 16)", clamp_to="seq_q"),
        block_knob(
            "block_kv", TRITON_BLOCKS, "keys/values per loop step (a power of two, >= 16)", clamp_to="seq_kv"
        ),
        NUM_STAGES,
        NUM_WARPS,
    )

    def working_set_bytes(self, config: Config, shape: Shape, dtype: str) -> int:
        """The Q block and the K and V blocks of every stage in flight."""
        rows = config["block_q"] + 2 * config["block_kv"]
        blocks = rows * padded_head_dim(shape["head_dim"])
        if shape.get("mask"):
            blocks += config["block_q"] * config["block_kv"]
        return blocks * element_size(dtype) * config["num_stages"]

    def loop_steps(self, config: Config, shape: Shape) -> int:
        """kv blocks of the longest program (causal: the last q block's)."""
        return -(-shape["seq_kv"] // config["block_kv"])

    def default_config(self, shape: Shape, dtype: str, limits: DeviceLimits) -> Config:
        """Square blocks of the rule's tile elements (whole dims for tiny problems)."""
        return triton_attention_default(self, shape, dtype, limits)


def triton_attention_default(
    declaration: TritonDeclaration, shape: Shape, dtype: str, limits: DeviceLimits
) -> Config:
    """The rule for a Triton attention kernel (forward or backward) with ``block_q`` and ``block_kv``
    knobs: square blocks of the rule's tile elements (whole dims for tiny problems), snapped to the
    knobs' values; stages and warps from its ``launch_defaults`` over its ``loop_steps``."""
    total = shape["seq_q"] * shape["seq_kv"]
    rule = heuristic_tiling(total, element_size(dtype), limits.local_memory_bytes)
    values = declaration.knob_values(shape)
    side = pow2_floor(math.sqrt(rule.tile_elements))
    small = total <= 1024  # the rule's "one tile of everything"
    blocks = {
        knob: values[knob][-1] if small else snap_down(side, values[knob]) for knob in ("block_q", "block_kv")
    }
    return {**blocks, **declaration.launch_defaults(rule, declaration.loop_steps(blocks, shape), limits)}
