"""``fused_attention`` forward: ``O = softmax(Q K^T / sqrt(head_dim) + mask) V``, FlashAttention-2 style:
its portable implementation.

Its declaration (dims, knobs, working set, default rule, counts) is
:mod:`tiletune.kernels.fused_attention.declaration`.

The tiling is the declaration's. Here, a q block whose keys
fit one kv block has nothing to rescale: its one step is a plain softmax,
computed in place by torch's fused softmax (one op instead of four passes).
All batch x heads are processed at once as batched ops; the working set is
counted per (batch, head), which is what one core holds when cores split
batch x heads.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.fused_attention.declaration import FusedAttentionDeclaration
from tiletune.kernels.native.space import NATIVE_BACKEND
from tiletune.kernels.native.spec import native_backends, run_native
from tiletune.kernels.pipeline import Slots, TiledLoop, execute, require_backend
from tiletune.kernels.spec import KernelSpec, expect_inputs, expect_ndim, expect_size, torch_dtype, widened

LOG2_E = math.log2(math.e)


@dataclass(frozen=True)
class AttentionStep:
    """One (q block, kv block) pair: ``first``/``last`` of its q block, ``masked`` across the diagonal."""

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


def attention_steps(
    seq_q: int, seq_kv: int, block_q: int, block_kv: int, causal: bool
) -> list[AttentionStep]:
    """Every step, q block after q block.

    With ``causal``, keys after the block's last query are never visited: kv
    blocks starting there are skipped and the block that crosses it is cut short.
    """
    steps = []
    for tile, q0 in enumerate(range(0, seq_q, block_q)):
        q = slice(q0, min(seq_q, q0 + block_q))
        kv_end = min(seq_kv, q.stop) if causal else seq_kv
        starts = range(0, kv_end, block_kv)
        for n, kv0 in enumerate(starts):
            kv = slice(kv0, min(kv_end, kv0 + block_kv))
            masked = causal and kv.stop - 1 > q.start
            steps.append(AttentionStep(tile, q, kv, n == 0, n == len(starts) - 1, masked))
    return steps


class CausalMask:
    """The masks (key ``j`` > query ``i``) of steps that straddle the diagonal, from one offsets table."""

    def __init__(self, block_q: int, block_kv: int, device: torch.device) -> None:
        self._offsets = torch.arange(block_kv, device=device) - torch.arange(block_q, device=device)[:, None]

    def of(self, step: AttentionStep) -> torch.Tensor | None:
        """``[rows, cols]`` booleans, True where masked; None for a step below the diagonal."""
        if not step.masked:
            return None
        diagonal = int(step.q.start - step.kv.start)
        return self._offsets[: step.rows, : step.cols] > diagonal


@dataclass
class OnlineSoftmax:
    """The compute stage's float32 state for one q block: scores, running max and sum, scratch."""

    scores: torch.Tensor
    row_max: torch.Tensor
    block_max: torch.Tensor
    row_sum: torch.Tensor
    scale: torch.Tensor

    @classmethod
    def allocate(cls, heads: int, block_q: int, block_kv: int, device: torch.device) -> OnlineSoftmax:
        """Flat float32 buffers sized for full blocks."""

        def f32(size: int) -> torch.Tensor:
            return torch.empty(size, dtype=torch.float32, device=device)

        rows = heads * block_q
        return cls(f32(rows * block_kv), f32(rows), f32(rows), f32(rows), f32(rows))

    @staticmethod
    def _view(flat: torch.Tensor, *size: int) -> torch.Tensor:
        return flat[: math.prod(size)].view(size)

    def fold(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        acc: torch.Tensor,
        *,
        first: bool,
        mask: torch.Tensor | None,
    ) -> None:
        """Fold one kv block into ``acc`` (``[bh, rows, head_dim]``).

        ``q`` is pre-scaled by ``log2(e) / sqrt(head_dim)``, so scores are in base 2 and
        ``exp2`` replaces ``exp`` (same result, a cheaper vectorised kernel on CPUs).
        """
        bh, rows, cols = q.shape[0], q.shape[1], k.shape[1]
        scores = self._view(self.scores, bh, rows, cols)
        row_max, block_max = self._view(self.row_max, bh, rows, 1), self._view(self.block_max, bh, rows, 1)
        row_sum, scale = self._view(self.row_sum, bh, rows, 1), self._view(self.scale, bh, rows, 1)
        torch.bmm(q, k.transpose(1, 2), out=scores)
        if mask is not None:
            scores.masked_fill_(mask, -math.inf)
        if first:
            torch.amax(scores, -1, keepdim=True, out=row_max)
            scores.sub_(row_max).exp2_()
            torch.sum(scores, -1, keepdim=True, out=row_sum)
            torch.bmm(scores, v, out=acc)
            return
        torch.amax(scores, -1, keepdim=True, out=block_max)
        torch.maximum(block_max, row_max, out=block_max)
        scores.sub_(block_max).exp2_()
        torch.sub(row_max, block_max, out=scale).exp2_()
        row_max.copy_(block_max)
        torch.sum(scores, -1, keepdim=True, out=block_max)
        torch.addcmul(block_max, row_sum, scale, out=row_sum)
        acc.mul_(scale).baddbmm_(scores, v)

    def whole(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, acc: torch.Tensor, mask: torch.Tensor | None
    ) -> None:
        """``acc = softmax(q k^T + mask) v`` for a q block whose keys are all in this one step.

        ``q`` is pre-scaled by ``1 / sqrt(head_dim)`` (natural base: torch's softmax).
        """
        bh, rows, cols = q.shape[0], q.shape[1], k.shape[1]
        scores = self._view(self.scores, bh, rows, cols)
        torch.bmm(q, k.transpose(1, 2), out=scores)
        if mask is not None:
            scores.masked_fill_(mask, -math.inf)
        torch.softmax(scores, -1, out=scores)
        torch.bmm(scores, v, out=acc)

    def finish(self, acc: torch.Tensor) -> None:
        """Divide the accumulator by the row sums."""
        bh, rows = acc.shape[0], acc.shape[1]
        acc.div_(self._view(self.row_sum, bh, rows, 1))


class FusedAttentionSpec(FusedAttentionDeclaration, KernelSpec):
    """Tiled attention forward with online softmax over kv blocks."""

    def backends(self) -> tuple[str, ...]:
        """``torch`` (portable), and ``native`` (the C++ CPU kernel) where it is built here."""
        return native_backends()

    def shape_of(self, inputs: Sequence[torch.Tensor]) -> Shape:
        """From ``q [batch, heads, seq_q, head_dim]`` and ``k``, ``v [batch, heads, seq_kv, head_dim]``.

        The tensors cannot tell ``causal``: it is 0 here; ``launch(..., causal=1)`` sets it.
        """
        expect_inputs(self.name, inputs, ("q", "k", "v"))
        q, k, v = inputs
        layout = "[batch, heads, seq, head_dim]"
        for name, tensor in zip("qkv", inputs, strict=True):
            expect_ndim(name, tensor, 4, layout)
        batch, heads, seq_q, head_dim = q.shape
        for name, tensor in (("k", k), ("v", v)):
            for index, dim in ((0, "batch"), (1, "heads"), (3, "head_dim")):
                expect_size(name, tensor.shape[index], q.shape[index], f"its {dim} (dim {index})")
        expect_size("v", v.shape[2], k.shape[2], "its seq_kv (dim 2, as k's)")
        return {
            "batch": batch,
            "heads": heads,
            "seq_q": seq_q,
            "seq_kv": k.shape[2],
            "head_dim": head_dim,
            "causal": 0,
        }

    def make_inputs(
        self, shape: Shape, dtype: str, device: torch.device, seed: int = 0
    ) -> tuple[torch.Tensor, ...]:
        """``q``, ``k``, ``v`` standard normal."""
        generator = torch.Generator().manual_seed(seed)
        b, h, d = shape["batch"], shape["heads"], shape["head_dim"]
        sizes = ((b, h, shape["seq_q"], d), (b, h, shape["seq_kv"], d), (b, h, shape["seq_kv"], d))
        return tuple(torch.randn(s, generator=generator).to(device, torch_dtype(dtype)) for s in sizes)

    def reference(self, inputs: Sequence[torch.Tensor], shape: Shape) -> torch.Tensor:
        """Explicit ``softmax(Q K^T * scale + mask) V`` in float32 (float64 for float64; not SDPA)."""
        q, k, v = (widened(t) for t in inputs)
        scores = q @ k.transpose(-2, -1) * shape["head_dim"] ** -0.5
        if shape["causal"]:
            above = torch.ones(shape["seq_q"], shape["seq_kv"], dtype=torch.bool, device=q.device).triu(1)
            scores = scores.masked_fill(above, -math.inf)
        return torch.softmax(scores, dim=-1) @ v

    def run(
        self, inputs: Sequence[torch.Tensor], config: Config, shape: Shape, backend: str = "torch"
    ) -> torch.Tensor:
        """Tiled attention through the pipeline executor (``native``: the C++ kernel)."""
        if backend == NATIVE_BACKEND:
            return run_native("fused_attention", inputs, config, shape)
        require_backend(self.backends(), backend)
        b, h, d = shape["batch"], shape["heads"], shape["head_dim"]
        bh, bq, bkv, buffers = b * h, config["block_q"], config["block_kv"], config["buffer_num"]
        q, k, v = (t.reshape(bh, t.shape[2], d) for t in inputs)
        out = torch.empty((bh, shape["seq_q"], d), dtype=q.dtype, device=q.device)
        steps = attention_steps(shape["seq_q"], shape["seq_kv"], bq, bkv, bool(shape["causal"]))
        q_slots, k_slots, v_slots = (Slots(buffers, bh * n * d, q.dtype, q.device) for n in (bq, bkv, bkv))
        accumulators = Slots(buffers, bh * bq * d, torch.float32, q.device)
        low = q.dtype != torch.float32
        upcast = Slots(3 if low else 0, bh * max(bq, bkv) * d, torch.float32, q.device)
        state = OnlineSoftmax.allocate(bh, bq, bkv, q.device)
        masks = CausalMask(bq, bkv, q.device) if shape["causal"] else None
        scale = d**-0.5  # the online softmax works in base 2 (exp2 is cheaper than exp): times log2(e)

        def copy_in(step: int, slot: int) -> None:
            s = steps[step]
            if s.first:
                q_slots.view(s.tile % buffers, (bh, s.rows, d)).copy_(q[:, s.q])
            k_slots.view(slot, (bh, s.cols, d)).copy_(k[:, s.kv])
            v_slots.view(slot, (bh, s.cols, d)).copy_(v[:, s.kv])

        def compute(step: int, slot: int, out_slot: int) -> None:
            s = steps[step]
            q_tile = q_slots.view(out_slot, (bh, s.rows, d))
            k_tile, v_tile = k_slots.view(slot, (bh, s.cols, d)), v_slots.view(slot, (bh, s.cols, d))
            if low:  # compute in float32 on upcast copies
                q_tile, q_local = upcast.view(0, (bh, s.rows, d)), q_tile
                k_tile = upcast.view(1, (bh, s.cols, d)).copy_(k_tile)
                v_tile = upcast.view(2, (bh, s.cols, d)).copy_(v_tile)
            else:
                q_local = q_tile
            whole = s.first and s.last
            if s.first:
                torch.mul(q_local, scale if whole else scale * LOG2_E, out=q_tile)
            acc = accumulators.view(out_slot, (bh, s.rows, d))
            mask = masks.of(s) if masks is not None else None
            if whole:
                state.whole(q_tile, k_tile, v_tile, acc, mask)
                return
            state.fold(q_tile, k_tile, v_tile, acc, first=s.first, mask=mask)
            if s.last:
                state.finish(acc)

        def copy_out(tile: int, out_slot: int) -> None:
            q_block = q_blocks[tile]
            out[:, q_block].copy_(accumulators.view(out_slot, (bh, q_block.stop - q_block.start, d)))

        q_blocks = [s.q for s in steps if s.first]
        tile_steps = [sum(1 for s in steps if s.tile == t) for t in range(len(q_blocks))]
        loop = TiledLoop(tile_steps, copy_in, compute, copy_out)
        execute(loop, buffers, config["pipeline_depth"], q.device)
        return out.view(b, h, shape["seq_q"], d)


SPEC = FusedAttentionSpec()
