"""``fused_attention_backward``'s declaration: the gradients of ``fused_attention``, FlashAttention-2 style.

The forward (:mod:`tiletune.kernels.fused_attention.declaration`) computes ``O = softmax(S) V`` with
``S = scale * Q K^T + mask`` (causal keys at ``-inf``) and saves each query row's natural log-sum-exp
``lse``. Given the gradient ``dO`` of ``O`` (and optionally ``dlse`` of ``lse``), the backward
recomputes the probabilities block by block instead of storing them:

- ``P = exp(S - lse)`` (0 on hidden keys and on rows whose ``lse`` is ``-inf``: no visible key);
- ``D = rowsum(dO * O) - dlse`` per query row (computed once, before the block loops);
- ``dP = dO V^T``, ``dS = P * (dP - D)``;
- ``dv = P^T dO``, ``dk = scale * dS^T Q``, ``dq = scale * dS K``.

With grouped-query attention (``kv_heads < heads``) a kv head's ``dk`` and ``dv`` are the sums over
the query heads of its group. Its shape is the forward's (the key carries the forward's dims:
``batch, heads, kv_heads, seq_q, seq_kv, head_dim, causal, mask``).

Inputs ``(q, k, v, out, lse, grad_out)`` and, with ``mask=1``, the additive ``mask``; outputs
``(dq, dk, dv)`` in q/k/v's dtypes and shapes.

Tiling, two passes, each output block written by one tile (no atomics):

- pass 1 (``dk``, ``dv``): a tile is one ``block_kv`` block of keys of one (batch, kv head); its steps
  are the (query head of the group, ``block_q`` block of queries) pairs that see the block (causal: from
  the first q block with a query that sees its first key). A step copies the Q and dO blocks in,
  recomputes ``P`` and ``dS`` of the block pair and accumulates ``dv``, ``dk`` in float32;
- pass 2 (``dq``): a tile is one ``block_q`` block of queries of one (batch, head); its steps are the
  ``block_kv`` blocks of keys and values it sees (the forward's bounds: causal blocks after its last
  visible key are skipped, the one crossing it cut); a step copies the K and V blocks in and
  accumulates ``dq``.

Knobs: ``block_q`` and ``block_kv`` (the forward's block sizes, clamped to ``seq_q`` / ``seq_kv``): ONE
pair used by both passes (pass 1 steps over q blocks of ``block_q``, pass 2 over kv blocks of
``block_kv``); ``buffer_num``: slots per queue (pass 1's Q and dO queues, pass 2's K and V queues, the
accumulators' output queue); ``pipeline_depth``: steps in flight through copy-in -> compute ->
copy-out (native: the next ``pipeline_depth - 1`` steps' blocks prefetched); native adds
``block_dim``, the cores the tiles of each pass are spread over; the Triton kernel has its own block
values (``TRITON_BLOCKS``), ``num_stages`` and ``num_warps``.

Working set per core (the larger of the two passes' queues): ``buffer_num`` Q and dO blocks (pass 1;
pass 2: K and V) in the input dtype, one K and V block (pass 2: Q and dO), ``P`` and ``dS`` (``block_q
x block_kv`` float32 each), ``buffer_num`` float32 accumulators (``dk + dv``: ``2 block_kv x d``, or
``dq``: ``block_q x d``, the larger), the rows' ``lse`` and ``D`` (float32), for float16/bfloat16 the
float32 copies of the Q, dO, K and V blocks the compute stage works on, and with ``mask``
``buffer_num`` mask blocks of ``block_q x block_kv``. The chip's local memory bounds it.

Default: the forward's rule (square blocks of the rule's tile elements, whole dims for tiny problems).
"""

from __future__ import annotations

from collections.abc import Mapping

from tiletune.client.space import DeviceLimits, Knob
from tiletune.kernels.declaration import (
    BUFFER_NUM,
    FLOAT32_BYTES,
    PIPELINE_DEPTH,
    Config,
    KernelDeclaration,
    Shape,
    element_size,
    float32_copies,
)
from tiletune.kernels.fused_attention.declaration import (
    BLOCKS,
    NO_CAUSAL,
    TRITON_BLOCKS,
    FusedAttentionDeclaration,
    check_kv_heads,
    padded_head_dim,
    triton_attention_default,
    visible_pairs,
)
from tiletune.kernels.native.space import PORTABLE_AND_NATIVE, NativeDeclaration, with_block_dim
from tiletune.kernels.triton.space import NUM_STAGES, NUM_WARPS, TritonDeclaration, block_knob


def _sizes(shape: Shape) -> tuple[int, int, int, int, int, int]:
    """``(batch, heads, kv_heads, seq_q, seq_kv, head_dim)``."""
    b, h, hkv, sq, skv, d = (shape[n] for n in ("batch", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim"))
    return b, h, hkv, sq, skv, d


def pass_tiles(config: Config, shape: Shape) -> tuple[int, int]:
    """The tiles of pass 1 (``batch * kv_heads * ceil(seq_kv / block_kv)``) and of pass 2 (``batch *
    heads * ceil(seq_q / block_q)``)."""
    b, h, hkv, sq, skv, _ = _sizes(shape)
    return b * hkv * -(-skv // config["block_kv"]), b * h * -(-sq // config["block_q"])


#: The forward's declaration, whose default rule the backward's is.
_FORWARD = FusedAttentionDeclaration()


class FusedAttentionBackwardDeclaration(KernelDeclaration):
    """The attention's backward: a dk/dv pass over kv blocks, a dq pass over q blocks (see the module).

    Its dims, knob values, shape rule (``kv_heads`` must divide ``heads``) and default rule are the
    forward's."""

    name = "fused_attention_backward"
    has_vendor = True
    version = 1
    description = (
        "attention backward, FlashAttention-2 style: a dk/dv pass over kv blocks and a dq pass over q "
        "blocks, P recomputed from the forward's log-sum-exp"
    )
    dims = FusedAttentionDeclaration.dims
    knobs: tuple[Knob, ...] = (
        Knob("block_q", BLOCKS, "queries per block: pass 1's steps, pass 2's tiles", clamp_to="seq_q"),
        Knob("block_kv", BLOCKS, "keys per block: pass 1's tiles, pass 2's steps", clamp_to="seq_kv"),
        BUFFER_NUM,
        PIPELINE_DEPTH,
    )
    implementations: tuple[str, ...] = PORTABLE_AND_NATIVE

    def parse_shape(self, raw: Mapping[str, object]) -> Shape:
        """The base checks, and ``kv_heads`` must divide ``heads`` (as the forward's)."""
        return check_kv_heads(super().parse_shape(raw))

    def default_config(self, shape: Shape, dtype: str, limits: DeviceLimits) -> Config:
        """The forward's rule: square blocks of the rule's tile elements (whole dims for tiny problems)."""
        return _FORWARD.default_config(shape, dtype, limits)

    def working_set_bytes(self, config: Config, shape: Shape, dtype: str) -> int:
        """Per core: the queues (the larger pass's), P and dS, the accumulators, row statistics,
        float32 copies for half types, mask blocks (see the module docstring)."""
        bq, bkv, buffers, d = config["block_q"], config["block_kv"], config["buffer_num"], shape["head_dim"]
        size = element_size(dtype)
        pass_1 = (buffers * 2 * bq + 2 * bkv) * d
        pass_2 = (buffers * 2 * bkv + 2 * bq) * d
        queues = max(pass_1, pass_2) * size
        scores = 2 * bq * bkv * FLOAT32_BYTES
        accumulators = buffers * max(2 * bkv * d, bq * d) * FLOAT32_BYTES
        rows = 2 * bq * FLOAT32_BYTES
        upcast = 0 if size >= FLOAT32_BYTES else (2 * bq + 2 * bkv) * d * FLOAT32_BYTES
        masks = buffers * bq * bkv * size if shape.get("mask") else 0
        return queues + scores + accumulators + rows + upcast + masks

    def flops(self, shape: Shape) -> float:
        """Five matmuls of ``2 * head_dim`` flops per visible (query, key) pair and (batch, head):
        ``S``, ``dP``, ``dv``, ``dk``, ``dq``."""
        b, h, _, sq, skv, d = _sizes(shape)
        causal = shape["causal"]
        pairs = sq * skv if causal == NO_CAUSAL else visible_pairs(sq, skv, causal)
        return 10.0 * b * h * pairs * d

    def bytes_moved(self, shape: Shape, dtype: str) -> float:
        """Read q, k, v, out, grad_out, lse (and the mask, counted whole) and write dq, dk, dv once."""
        tensors = self.tensor_bytes(shape, dtype)
        return float(sum(tensors.values()))

    def tensor_bytes(self, shape: Shape, dtype: str) -> dict[str, int]:
        """``q``, ``out``, ``grad_out``, ``dq`` (``batch x heads x seq_q x head_dim``), ``k``, ``v``,
        ``dk``, ``dv`` (``batch x kv_heads x seq_kv x head_dim``), ``lse`` (float32 ``batch x heads x
        seq_q``), and with ``mask`` the mask at its largest (``batch x heads x seq_q x seq_kv``)."""
        b, h, hkv, sq, skv, d = _sizes(shape)
        queries, keys = b * h * sq * d * element_size(dtype), b * hkv * skv * d * element_size(dtype)
        tensors = {"q": queries, "k": keys, "v": keys, "out": queries, "lse": b * h * sq * FLOAT32_BYTES}
        tensors["grad_out"] = queries
        if shape.get("mask"):
            tensors["mask"] = b * h * sq * skv * element_size(dtype)
        return tensors | {"dq": queries, "dk": keys, "dv": keys}

    def workspace_bytes(self, shape: Shape, dtype: str) -> dict[str, int]:
        """The reference's float32 copies of q, k, v, out and grad_out (k and v at ``heads``), its four
        float32 ``seq_q x seq_kv`` matrices per (batch, head) (scores, P, dP, dS) and its float32
        gradients (dk and dv at ``heads``, before the group sums): ``reference``."""
        b, h, _, sq, skv, d = _sizes(shape)
        matrix = b * h * sq * skv * FLOAT32_BYTES
        copies = float32_copies(
            dtype,
            q=b * h * sq * d,
            k=b * h * skv * d,
            v=b * h * skv * d,
            out=b * h * sq * d,
            grad_out=b * h * sq * d,
        )
        return {
            **copies,
            "scores": matrix,
            "probabilities": matrix,
            "grad_probabilities": matrix,
            "grad_scores": matrix,
            "reference": (b * h * sq * d + 2 * b * h * skv * d) * FLOAT32_BYTES,
        }


class NativeFusedAttentionBackwardDeclaration(NativeDeclaration, FusedAttentionBackwardDeclaration):
    """``native_fused_attention_backward``: each pass's tiles dealt to ``block_dim`` cores round-robin
    (``kernels/native/csrc/attention_backward.cpp``)."""

    name = "native_fused_attention_backward"
    version = 1
    description = "attention backward, native CPU: each pass's tiles over block_dim cores"
    portable = FusedAttentionBackwardDeclaration
    knobs = with_block_dim(FusedAttentionBackwardDeclaration.knobs)

    def tile_count(self, config: Config, shape: Shape) -> int:
        """The larger pass's tiles: ``max(batch * kv_heads * kv blocks, batch * heads * q blocks)``."""
        return max(pass_tiles(config, shape))


class TritonFusedAttentionBackwardDeclaration(TritonDeclaration, FusedAttentionBackwardDeclaration):
    """``triton_fused_attention_backward``: a dk/dv program per (batch, kv head, kv block) over its q
    blocks, a dq program per (batch, head, q block) over its kv blocks (see
    ``kernels/fused_attention_backward/triton.py``)."""

    name = "triton_fused_attention_backward"
    version = 1
    description = (
        "fused_attention_backward in Triton: a dk/dv kernel over kv blocks, a dq kernel over q blocks"
    )
    knobs = (
        block_knob(
            "block_q", TRITON_BLOCKS, "queries per block, both kernels (a power of two, >= 16)", "seq_q"
        ),
        block_knob(
            "block_kv", TRITON_BLOCKS, "keys per block, both kernels (a power of two, >= 16)", "seq_kv"
        ),
        NUM_STAGES,
        NUM_WARPS,
    )

    def working_set_bytes(self, config: Config, shape: Shape, dtype: str) -> int:
        """The Q, dO, K and V blocks (and with ``mask`` its ``block_q x block_kv`` block) of every
        stage in flight: ``((2 block_q + 2 block_kv) * padded head_dim [+ block_q * block_kv]) *
        element size * num_stages``."""
        blocks = (2 * config["block_q"] + 2 * config["block_kv"]) * padded_head_dim(shape["head_dim"])
        if shape.get("mask"):
            blocks += config["block_q"] * config["block_kv"]
        return blocks * element_size(dtype) * config["num_stages"]

    def loop_steps(self, config: Config, shape: Shape) -> int:
        """The longer main loop: the dk/dv kernel's q blocks or the dq kernel's kv blocks."""
        return max(-(-shape["seq_q"] // config["block_q"]), -(-shape["seq_kv"] // config["block_kv"]))

    def default_config(self, shape: Shape, dtype: str, limits: DeviceLimits) -> Config:
        """The forward Triton kernel's rule: square blocks of the rule's tile elements (whole dims for
        tiny problems), stages and warps from :meth:`launch_defaults`."""
        return triton_attention_default(self, shape, dtype, limits)
