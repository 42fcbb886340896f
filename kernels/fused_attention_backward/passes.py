"""The portable ``fused_attention_backward``'s two tiled passes, through the staged pipeline
(:mod:`tiletune.kernels.pipeline`): the reference of what the knobs mean.

Both passes process every (batch, head) of a block at once as batched ops, in the compute dtype
(float32; float64 for float64 inputs). Before them, ``D = rowsum(dO * O) - dlse`` and the rows'
``lse`` (``-inf``: a row that sees no key, taken as 0, its scores being ``-inf`` too) are computed
once. The scores are kept in base 2 (Q is pre-scaled by ``scale * log2(e)``, the mask added times
``log2(e)``, ``P = exp2(S2 - lse * log2(e))``), so ``dk`` is divided by ``log2(e)`` on copy-out.

- Pass 1 (:class:`KeyPass`): a tile is one ``block_kv`` block of keys; its steps are the ``block_q``
  blocks of queries that see it (causal: from the first query that sees its first key; a block no
  query sees keeps one fully masked step, so that its zeros are written). Copy-in: the step's Q and
  dO blocks into their slots (and, first in its tile, the K and V blocks, repeated for each query
  head of a group). Compute: ``P``, ``dS``, ``dv += P^T dO``, ``dk += dS^T Q`` into the tile's
  float32 accumulators. Copy-out: the group sums of ``dk`` and ``dv``.
- Pass 2 (:class:`QueryPass`): the forward's tiles (:func:`attention_steps`): a tile is one ``block_q``
  block of queries, its steps the ``block_kv`` blocks it sees. Copy-in: the K and V blocks (and,
  first in its tile, the Q and dO blocks). Compute: ``dq += dS K``. Copy-out: ``scale * dq``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.fused_attention.declaration import CAUSAL_BOTTOM_RIGHT, NO_CAUSAL, visible_keys
from tiletune.kernels.fused_attention.tiles import LOG2_E, AttentionStep, CausalMask, attention_steps
from tiletune.kernels.pipeline import ComputeFn, Slots, StageFn, TiledLoop, execute

#: ``(dq, dk, dv)`` in q's, k's and v's dtype and shape.
Gradients = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def key_steps(seq_q: int, seq_kv: int, block_q: int, block_kv: int, causal: int) -> list[AttentionStep]:
    """Pass 1's steps, kv block after kv block: the q blocks that see each (see the module)."""
    shift = seq_kv - seq_q if causal == CAUSAL_BOTTOM_RIGHT else 0
    last_block = (seq_q - 1) // block_q * block_q
    steps = []
    for tile, kv0 in enumerate(range(0, seq_kv, block_kv)):
        kv = slice(kv0, min(seq_kv, kv0 + block_kv))
        first_query = 0 if causal == NO_CAUSAL else max(0, kv0 - shift)
        starts = (
            range(first_query // block_q * block_q, seq_q, block_q)
            if first_query < seq_q
            else range(last_block, seq_q, block_q)  # no query sees the block: one fully masked step
        )
        for n, q0 in enumerate(starts):
            q = slice(q0, min(seq_q, q0 + block_q))
            masked = causal != NO_CAUSAL and kv.stop > visible_keys(q.start, seq_q, seq_kv, causal)
            steps.append(AttentionStep(tile, q, kv, n == 0, n == len(starts) - 1, masked))
    return steps


class BackwardState:
    """What both passes read: the inputs as ``[batch * heads, seq, d]`` (k and v seen per query head,
    without a copy), ``D`` and ``lse * log2(e)`` per row, the mask, the block scratch of the compute
    stage (scores, then P; dP, then dS; the scaled Q and the widened dO)."""

    def __init__(
        self,
        inputs: Sequence[torch.Tensor],
        config: Config,
        shape: Shape,
        scale: float,
        grad_lse: torch.Tensor | None,
    ) -> None:
        q, k, v, out, lse, grad_out = inputs[:6]
        b, h, hkv, d = shape["batch"], shape["heads"], shape["kv_heads"], shape["head_dim"]
        sq, skv, bh = shape["seq_q"], shape["seq_kv"], b * h
        self.sizes, self.shape, self.scale, self.config = (b, h, hkv, d), shape, scale, config
        self.dtype, self.device = q.dtype, q.device
        self.compute_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        self.q, self.grad_out = q.reshape(bh, sq, d), grad_out.reshape(bh, sq, d)
        self.k, self.v = (t.unsqueeze(2).expand(b, hkv, h // hkv, skv, d) for t in (k, v))
        self.mask = inputs[6] if len(inputs) == 7 else None
        wide = (grad_out.to(self.compute_dtype) * out.to(self.compute_dtype)).sum(-1)
        if grad_lse is not None:
            wide = wide - grad_lse.to(self.compute_dtype)
        self.delta = wide.reshape(bh, sq, 1)
        lse_wide = lse.reshape(bh, sq, 1).to(self.compute_dtype)
        self.lse2 = torch.where(torch.isneginf(lse_wide), 0.0, lse_wide) * LOG2_E
        bq, bkv = config["block_q"], config["block_kv"]
        self.causal = CausalMask((bq, bkv), sq, skv, shape["causal"], q.device) if shape["causal"] else None
        self.low = q.dtype != self.compute_dtype
        wide_blocks = bh * max(bq, bkv) * d
        # scratch: 0 the scaled Q, 1 the widened dO, 2 and 3 the widened K and V; matrices: P, dS
        self.scratch = Slots(4, wide_blocks, self.compute_dtype, q.device)
        self.matrices = Slots(2, bh * bq * bkv, self.compute_dtype, q.device)

    def widened(self, index: int, block: torch.Tensor) -> torch.Tensor:
        """``block`` in the compute dtype: itself, or copied into scratch ``index``."""
        if not self.low:
            return block
        return self.scratch.view(index, tuple(block.shape)).copy_(block)

    def scaled_q(self, block: torch.Tensor) -> torch.Tensor:
        """The Q block times ``scale * log2(e)``, into scratch 0 (widened)."""
        return torch.mul(block, self.scale * LOG2_E, out=self.scratch.view(0, tuple(block.shape)))

    def p_and_ds(
        self, step: AttentionStep, qf: torch.Tensor, gf: torch.Tensor, kf: torch.Tensor, vf: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``P`` and ``dS`` of one block pair (``[bh, rows, cols]``) from the widened blocks (``qf``
        scaled)."""
        b, h, _, _ = self.sizes
        size = (b * h, step.rows, step.cols)
        scores = torch.bmm(qf, kf.transpose(1, 2), out=self.matrices.view(0, size))
        if self.mask is not None:
            scores.view(b, h, step.rows, step.cols).add_(self.mask[:, :, step.q, step.kv], alpha=LOG2_E)
        hidden = self.causal.of(step) if self.causal is not None else None
        if hidden is not None:
            scores.masked_fill_(hidden, float("-inf"))
        p = scores.sub_(self.lse2[:, step.q]).exp2_()
        ds = torch.bmm(gf, vf.transpose(1, 2), out=self.matrices.view(1, size))
        return p, ds.sub_(self.delta[:, step.q]).mul_(p)

    def accumulate(self, acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, first: bool) -> None:
        """``acc = a @ b`` on a tile's first step, ``acc += a @ b`` after."""
        if first:
            torch.bmm(a, b, out=acc)
        else:
            acc.baddbmm_(a, b)

    def run(
        self, steps: list[AttentionStep], copy_in: StageFn, compute: ComputeFn, copy_out: StageFn
    ) -> None:
        """Execute one pass's ``steps`` through the pipeline with its three stages."""
        counts = [0] * (1 + max(s.tile for s in steps))
        for s in steps:
            counts[s.tile] += 1
        loop = TiledLoop(counts, copy_in, compute, copy_out)
        execute(loop, self.config["buffer_num"], self.config["pipeline_depth"], self.device)


class KeyPass:
    """Pass 1: ``dk`` and ``dv``, a tile per kv block (see the module)."""

    def __init__(self, state: BackwardState, dk: torch.Tensor, dv: torch.Tensor) -> None:
        self.state, self.dk, self.dv = state, dk, dv
        (b, h, _, d), config = state.sizes, state.config
        bq, bkv, buffers = config["block_q"], config["block_kv"], config["buffer_num"]
        self.steps = key_steps(state.shape["seq_q"], state.shape["seq_kv"], bq, bkv, state.shape["causal"])
        self.tiles = [s for s in self.steps if s.first]
        self.queries = [Slots(buffers, b * h * bq * d, state.dtype, state.device) for _ in range(2)]
        self.keys = [Slots(buffers, b * h * bkv * d, state.dtype, state.device) for _ in range(2)]
        self.accumulators = [
            Slots(buffers, b * h * bkv * d, state.compute_dtype, state.device) for _ in range(2)
        ]
        self.tile_kv: tuple[torch.Tensor, torch.Tensor] | None = None

    def copy_in(self, step: int, slot: int) -> None:
        """The step's Q and dO blocks; first in its tile, the K and V blocks (per query head)."""
        s, (b, h, hkv, d) = self.steps[step], self.state.sizes
        for slots, source in zip(self.queries, (self.state.q, self.state.grad_out), strict=True):
            slots.view(slot, (b * h, s.rows, d)).copy_(source[:, s.q])
        if s.first:
            for slots, source in zip(self.keys, (self.state.k, self.state.v), strict=True):
                size = (b, hkv, h // hkv, s.cols, d)
                slots.view(s.tile % self.state.config["buffer_num"], size).copy_(source[:, :, :, s.kv])

    def compute(self, step: int, slot: int, out_slot: int) -> None:
        """``P`` and ``dS`` of the step; ``dv += P^T dO``, ``dk += dS^T Q`` (scaled Q)."""
        s, state, (b, h, _, d) = self.steps[step], self.state, self.state.sizes
        rows, cols = (b * h, s.rows, d), (b * h, s.cols, d)
        qf = state.scaled_q(self.queries[0].view(slot, rows))
        gf = state.widened(1, self.queries[1].view(slot, rows))
        if s.first or self.tile_kv is None:  # the tile's widened K and V, kept for its steps
            k_block, v_block = (slots.view(out_slot, cols) for slots in self.keys)
            self.tile_kv = (state.widened(2, k_block), state.widened(3, v_block))
        kf, vf = self.tile_kv
        p, ds = state.p_and_ds(s, qf, gf, kf, vf)
        dk, dv = (acc.view(out_slot, cols) for acc in self.accumulators)
        state.accumulate(dv, p.transpose(1, 2), gf, first=s.first)
        state.accumulate(dk, ds.transpose(1, 2), qf, first=s.first)

    def copy_out(self, tile: int, out_slot: int) -> None:
        """The group sums of the tile's ``dk`` (over ``log2(e)``) and ``dv`` into the outputs."""
        kv, (b, h, hkv, d) = self.tiles[tile].kv, self.state.sizes
        cols = kv.stop - kv.start
        for acc, target, factor in zip(self.accumulators, (self.dk, self.dv), (1 / LOG2_E, 1.0), strict=True):
            grouped = acc.view(out_slot, (b, hkv, h // hkv, cols, d))
            total = grouped.sum(2) if h != hkv else grouped.squeeze(2)
            target[:, :, kv].copy_(total.mul_(factor) if factor != 1.0 else total)

    def run(self) -> None:
        """Execute the pass."""
        self.state.run(self.steps, self.copy_in, self.compute, self.copy_out)


class QueryPass:
    """Pass 2: ``dq``, a tile per q block (see the module)."""

    def __init__(self, state: BackwardState, dq: torch.Tensor) -> None:
        self.state, self.dq = state, dq
        (b, h, _, d), config = state.sizes, state.config
        bq, bkv, buffers = config["block_q"], config["block_kv"], config["buffer_num"]
        self.steps = attention_steps(
            state.shape["seq_q"], state.shape["seq_kv"], bq, bkv, state.shape["causal"]
        )
        self.tiles = [s for s in self.steps if s.first]
        self.queries = [Slots(buffers, b * h * bq * d, state.dtype, state.device) for _ in range(2)]
        self.keys = [Slots(buffers, b * h * bkv * d, state.dtype, state.device) for _ in range(2)]
        self.accumulator = Slots(buffers, b * h * bq * d, state.compute_dtype, state.device)
        self.tile_q: tuple[torch.Tensor, torch.Tensor] | None = None

    def copy_in(self, step: int, slot: int) -> None:
        """The step's K and V blocks (per query head); first in its tile, the Q and dO blocks."""
        s, (b, h, hkv, d) = self.steps[step], self.state.sizes
        if s.first:
            for slots, source in zip(self.queries, (self.state.q, self.state.grad_out), strict=True):
                slots.view(s.tile % self.state.config["buffer_num"], (b * h, s.rows, d)).copy_(source[:, s.q])
        for slots, source in zip(self.keys, (self.state.k, self.state.v), strict=True):
            slots.view(slot, (b, hkv, h // hkv, s.cols, d)).copy_(source[:, :, :, s.kv])

    def compute(self, step: int, slot: int, out_slot: int) -> None:
        """``P`` and ``dS`` of the step; ``dq += dS K``."""
        s, state, (b, h, _, d) = self.steps[step], self.state, self.state.sizes
        rows, cols = (b * h, s.rows, d), (b * h, s.cols, d)
        if s.first or self.tile_q is None:  # the tile's scaled Q and widened dO, kept for its steps
            qf = state.scaled_q(self.queries[0].view(out_slot, rows))
            self.tile_q = (qf, state.widened(1, self.queries[1].view(out_slot, rows)))
        qf, gf = self.tile_q
        kf, vf = (state.widened(2 + i, self.keys[i].view(slot, cols)) for i in range(2))
        _, ds = state.p_and_ds(s, qf, gf, kf, vf)
        state.accumulate(self.accumulator.view(out_slot, rows), ds, kf, first=s.first)

    def copy_out(self, tile: int, out_slot: int) -> None:
        """``scale * dq`` of the tile into the output."""
        q, (b, h, _, d) = self.tiles[tile].q, self.state.sizes
        acc = self.accumulator.view(out_slot, (b * h, q.stop - q.start, d))
        self.dq[:, q].copy_(acc.mul_(self.state.scale))

    def run(self) -> None:
        """Execute the pass."""
        self.state.run(self.steps, self.copy_in, self.compute, self.copy_out)


def tiled_gradients(
    inputs: Sequence[torch.Tensor], config: Config, shape: Shape, scale: float, grad_lse: torch.Tensor | None
) -> Gradients:
    """``(dq, dk, dv)`` of ``inputs`` (``q, k, v, out, lse, grad_out[, mask]``) by the two passes."""
    q, k, v = inputs[:3]
    state = BackwardState(inputs, config, shape, scale, grad_lse)
    b, h, _, d = state.sizes
    dq = torch.empty((b * h, shape["seq_q"], d), dtype=q.dtype, device=q.device)
    dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (k, v))
    KeyPass(state, dk, dv).run()
    QueryPass(state, dq).run()
    return dq.view(q.shape), dk, dv
