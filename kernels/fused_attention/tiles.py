"""The portable ``fused_attention`` kernel's tiles: its steps, their causal masks and the compute
stage's online softmax (float32 running max and sum over kv blocks).

All ``batch x heads`` of a block are processed at once as batched ops. A query row that sees no
key (an additive mask of ``-inf`` over its keys, or a bottom-right causal row before the first
key) keeps a row max of ``-inf``: the softmax subtracts 0 instead (so no ``-inf - -inf``), its sum
stays 0, its output 0 and its log-sum-exp ``-inf``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tiletune.kernels.fused_attention.declaration import CAUSAL_BOTTOM_RIGHT, NO_CAUSAL, visible_keys

LOG2_E = math.log2(math.e)
LN_2 = math.log(2.0)


@dataclass(frozen=True)
class AttentionStep:
    """One (q block, kv block) pair: ``first``/``last`` of its q block, ``masked`` across the causal
    boundary."""

    tile: int
    q: slice
    kv: slice
    first: bool
    last: bool
    masked: bool

    @property
    def rows(self) -> int:
        """Queries in the block."""
        return int(self.q.stop - self.q.start)

    @property
    def cols(self) -> int:
        """Keys in the block."""
        return int(self.kv.stop - self.kv.start)


def attention_steps(seq_q: int, seq_kv: int, block_q: int, block_kv: int, causal: int) -> list[AttentionStep]:
    """Every step, q block after q block.

    With ``causal``, keys after the block's last query's last visible key are never visited: kv
    blocks starting there are skipped and the block that crosses it is cut short. A q block that
    sees no key at all (bottom-right, ``seq_q > seq_kv``) keeps one fully masked step, so that its
    output is written (zeros).
    """
    steps = []
    for tile, q0 in enumerate(range(0, seq_q, block_q)):
        q = slice(q0, min(seq_q, q0 + block_q))
        kv_end = max(1, visible_keys(q.stop - 1, seq_q, seq_kv, causal))
        starts = range(0, kv_end, block_kv)
        first_row_sees = visible_keys(q.start, seq_q, seq_kv, causal)
        for n, kv0 in enumerate(starts):
            kv = slice(kv0, min(kv_end, kv0 + block_kv))
            masked = causal != NO_CAUSAL and kv.stop > first_row_sees
            steps.append(AttentionStep(tile, q, kv, n == 0, n == len(starts) - 1, masked))
    return steps


class CausalMask:
    """The masks of steps that straddle the causal boundary, from one offsets table."""

    def __init__(
        self, blocks: tuple[int, int], seq_q: int, seq_kv: int, causal: int, device: torch.device
    ) -> None:
        block_q, block_kv = blocks
        self._offsets = torch.arange(block_kv, device=device) - torch.arange(block_q, device=device)[:, None]
        self._shift = seq_kv - seq_q if causal == CAUSAL_BOTTOM_RIGHT else 0

    def of(self, step: AttentionStep) -> torch.Tensor | None:
        """``[rows, cols]`` booleans, True where masked; None for a step wholly before the boundary."""
        if not step.masked:
            return None
        diagonal = int(step.q.start - step.kv.start) + self._shift
        return self._offsets[: step.rows, : step.cols] > diagonal


@dataclass
class OnlineSoftmax:
    """The compute stage's float32 state for one q block: scores, running max and sum, scratch."""

    scores: torch.Tensor
    row_max: torch.Tensor
    block_max: torch.Tensor
    row_sum: torch.Tensor
    scale: torch.Tensor
    safe_max: torch.Tensor

    @classmethod
    def allocate(cls, heads: int, block_q: int, block_kv: int, device: torch.device) -> OnlineSoftmax:
        """Flat float32 buffers sized for full blocks."""

        def f32(size: int) -> torch.Tensor:
            return torch.empty(size, dtype=torch.float32, device=device)

        rows = heads * block_q
        return cls(f32(rows * block_kv), f32(rows), f32(rows), f32(rows), f32(rows), f32(rows))

    @staticmethod
    def _view(flat: torch.Tensor, *size: int) -> torch.Tensor:
        return flat[: math.prod(size)].view(size)

    def _rows(self, flat: torch.Tensor, bh: int, rows: int) -> torch.Tensor:
        return self._view(flat, bh, rows, 1)

    def block_scores(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """``q k^T`` of one step into the scores buffer (``[bh, rows, cols]``)."""
        out = self._view(self.scores, q.shape[0], q.shape[1], k.shape[1])
        torch.bmm(q, k.transpose(1, 2), out=out)
        return out

    def fold(self, scores: torch.Tensor, v: torch.Tensor, acc: torch.Tensor, *, first: bool) -> None:
        """Fold one kv block's ``scores`` (base 2: ``q`` was pre-scaled by ``log2(e) * scale``,
        so ``exp2`` replaces ``exp``, a cheaper vectorised kernel on CPUs) into ``acc``
        (``[bh, rows, head_dim]``)."""
        bh, rows = scores.shape[0], scores.shape[1]
        row_max, block_max = self._rows(self.row_max, bh, rows), self._rows(self.block_max, bh, rows)
        row_sum, scale = self._rows(self.row_sum, bh, rows), self._rows(self.scale, bh, rows)
        safe_max = self._rows(self.safe_max, bh, rows)
        if first:
            torch.amax(scores, -1, keepdim=True, out=row_max)
            torch.nan_to_num(row_max, neginf=0.0, out=safe_max)
            scores.sub_(safe_max).exp2_()
            torch.sum(scores, -1, keepdim=True, out=row_sum)
            torch.bmm(scores, v, out=acc)
            return
        torch.amax(scores, -1, keepdim=True, out=block_max)
        torch.maximum(block_max, row_max, out=block_max)
        torch.nan_to_num(block_max, neginf=0.0, out=safe_max)
        scores.sub_(safe_max).exp2_()
        torch.sub(row_max, safe_max, out=scale).exp2_()
        row_max.copy_(block_max)
        torch.sum(scores, -1, keepdim=True, out=block_max)
        torch.addcmul(block_max, row_sum, scale, out=row_sum)
        acc.mul_(scale).baddbmm_(scores, v)

    def finish(self, acc: torch.Tensor, lse: torch.Tensor) -> None:
        """Divide the accumulator by the row sums and write the rows' natural log-sum-exp into
        ``lse`` (``[bh, rows]``)."""
        bh, rows = acc.shape[0], acc.shape[1]
        row_sum = self._rows(self.row_sum, bh, rows)
        safe_max = self._rows(self.safe_max, bh, rows)
        torch.add(safe_max.squeeze(-1) * LN_2, row_sum.squeeze(-1).log(), out=lse)
        acc.div_(row_sum.clamp_min_(torch.finfo(torch.float32).tiny))

    def whole(self, scores: torch.Tensor, v: torch.Tensor, acc: torch.Tensor, lse: torch.Tensor) -> None:
        """``acc = softmax(scores) v`` and ``lse``, for a q block whose keys are all in this one step
        and whose rows each see a key (natural base: ``q`` pre-scaled by ``scale``; torch's softmax)."""
        torch.logsumexp(scores, -1, out=lse)
        torch.softmax(scores, -1, out=scores)
        torch.bmm(scores, v, out=acc)
