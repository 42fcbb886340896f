"""``fused_attention`` forward: ``O = softmax(scale * Q K^T + mask) V``, FlashAttention-2 style:
its portable implementation.

Its declaration (dims, knobs, working set, default rule, counts) is
:mod:`tiletune.kernels.fused_attention.declaration`; its tiles and online softmax are
:mod:`~tiletune.kernels.fused_attention.tiles`; its reference is
:mod:`~tiletune.kernels.fused_attention.formula`.

The tiling is the declaration's. Here, a q block whose keys fit one kv block (and whose rows all
see a key) has nothing to rescale: its one step is a plain softmax, computed in place by torch's
fused softmax (one op instead of four passes). All batch x heads are processed at once as batched
ops; grouped k and v blocks are copied into their slots once per query head of the group.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.errors import ShapeError
from tiletune.kernels.fused_attention import formula, vendor
from tiletune.kernels.fused_attention.declaration import CAUSAL_BOTTOM_RIGHT, FusedAttentionDeclaration
from tiletune.kernels.fused_attention.tiles import LOG2_E, CausalMask, OnlineSoftmax, attention_steps
from tiletune.kernels.native.space import NATIVE_BACKEND
from tiletune.kernels.native.spec import native_backends
from tiletune.kernels.pipeline import Slots, TiledLoop, execute, require_backend
from tiletune.kernels.spec import KernelSpec, VendorOp, expect_inputs, expect_ndim, expect_size, torch_dtype

AttentionOutputs = tuple[torch.Tensor, torch.Tensor]
"""``(out [batch, heads, seq_q, head_dim], lse [batch, heads, seq_q] float32)``."""


def _expect_mask(mask: torch.Tensor, q: torch.Tensor, seq_kv: int) -> None:
    """Raise :class:`ShapeError` unless ``mask`` is additive in q's dtype and broadcasts to
    ``[batch, heads, seq_q, seq_kv]`` with whole ``seq_q x seq_kv`` planes."""
    expect_ndim("mask", mask, 4, "[batch or 1, heads or 1, seq_q, seq_kv]")
    for index, dim in ((0, "batch"), (1, "heads")):
        if mask.shape[index] not in (1, q.shape[index]):
            expect_size("mask", mask.shape[index], q.shape[index], f"its {dim} (dim {index}) or 1")
    expect_size("mask", mask.shape[2], q.shape[2], "its seq_q (dim 2, as q's)")
    expect_size("mask", mask.shape[3], seq_kv, "its seq_kv (dim 3, as k's)")
    if mask.dtype != q.dtype:
        raise ShapeError("inputs.mask", f"must be additive in q's dtype ({q.dtype}), got {mask.dtype}")


class FusedAttentionSpec(FusedAttentionDeclaration, KernelSpec):
    """Tiled attention forward with online softmax over kv blocks."""

    def backends(self) -> tuple[str, ...]:
        """``torch`` (portable), and ``native`` (the C++ CPU kernel) where it is built here."""
        return native_backends()

    def shape_of(self, inputs: Sequence[torch.Tensor]) -> Shape:
        """From ``q [batch, heads, seq_q, head_dim]``, ``k``, ``v [batch, kv_heads, seq_kv, head_dim]``
        and, as a fourth input, an additive mask (``mask=1``; see the declaration).

        The tensors cannot tell ``causal``: it is 0 here; ``launch(..., causal=1)`` sets it.
        """
        names = ("q", "k", "v", "mask") if len(inputs) == 4 else ("q", "k", "v")
        expect_inputs(self.name, inputs, names)
        q, k, v = inputs[:3]
        layout = "[batch, heads, seq, head_dim]"
        for name, tensor in zip("qkv", inputs[:3], strict=True):
            expect_ndim(name, tensor, 4, layout)
        batch, heads, seq_q, head_dim = q.shape
        for name, tensor in (("k", k), ("v", v)):
            for index, dim in ((0, "batch"), (3, "head_dim")):
                expect_size(name, tensor.shape[index], q.shape[index], f"its {dim} (dim {index})")
        expect_size("v", v.shape[1], k.shape[1], "its kv_heads (dim 1, as k's)")
        expect_size("v", v.shape[2], k.shape[2], "its seq_kv (dim 2, as k's)")
        if len(inputs) == 4:
            _expect_mask(inputs[3], q, k.shape[2])
        shape = {"batch": batch, "heads": heads, "kv_heads": k.shape[1], "seq_q": seq_q}
        return shape | {"seq_kv": k.shape[2], "head_dim": head_dim, "causal": 0, "mask": len(inputs) - 3}

    def make_inputs(
        self, shape: Shape, dtype: str, device: torch.device, seed: int = 0
    ) -> tuple[torch.Tensor, ...]:
        """``q``, ``k``, ``v`` standard normal; with ``mask``, a ``[batch, 1, seq_q, seq_kv]`` bias
        (standard normal, ``-inf`` on about a tenth of the keys: padding)."""
        generator = torch.Generator().manual_seed(seed)
        b, h, hkv, d = shape["batch"], shape["heads"], shape["kv_heads"], shape["head_dim"]
        sq, skv = shape["seq_q"], shape["seq_kv"]
        sizes = [(b, h, sq, d), (b, hkv, skv, d), (b, hkv, skv, d)]
        tensors = [torch.randn(s, generator=generator) for s in sizes]
        if shape.get("mask"):
            bias = torch.randn((b, 1, sq, skv), generator=generator)
            hidden = torch.rand((b, 1, 1, skv), generator=generator) < 0.1
            tensors.append(bias.masked_fill(hidden, float("-inf")))
        return tuple(t.to(device, torch_dtype(dtype)) for t in tensors)

    def vendor(self, shape: Shape, device_kind: str) -> VendorOp | None:
        """torch's fused attention on CPUs (:mod:`tiletune.kernels.fused_attention.vendor`)."""
        return vendor.output(shape, device_kind)

    def reference(self, inputs: Sequence[torch.Tensor], shape: Shape) -> torch.Tensor:
        """The explicit formula (:func:`~tiletune.kernels.fused_attention.formula.attention`) in float32
        (float64 for float64), not SDPA."""
        q, k, v = inputs[:3]
        mask = inputs[3] if len(inputs) == 4 else None
        return formula.attention(q, k, v, mask=mask, causal=shape["causal"])[0]

    def run(
        self, inputs: Sequence[torch.Tensor], config: Config, shape: Shape, backend: str = "torch"
    ) -> torch.Tensor:
        """The attention's output (:meth:`attend`'s first)."""
        return self.attend(inputs, config, shape, backend)[0]

    def attend(
        self,
        inputs: Sequence[torch.Tensor],
        config: Config,
        shape: Shape,
        backend: str = "torch",
        scale: float | None = None,
    ) -> AttentionOutputs:
        """``(out, lse)`` of ``inputs`` (``q, k, v`` and, with ``mask``, the mask) under ``config``:
        the tiled pipeline (``native``: the C++ kernel). ``scale``: ``None`` is ``1 / sqrt(head_dim)``."""
        if backend == NATIVE_BACKEND:
            from tiletune.kernels.fused_attention.native import SPEC as NATIVE

            return NATIVE.attend(inputs, config, shape, NATIVE_BACKEND, scale)
        require_backend(self.backends(), backend)
        return _TiledAttention(inputs, config, shape, formula.scale_of(shape["head_dim"], scale)).run()


class _TiledAttention:
    """One portable call: the queues' slots, the online softmax state and the three stages."""

    def __init__(self, inputs: Sequence[torch.Tensor], config: Config, shape: Shape, scale: float) -> None:
        b, h, hkv, d = shape["batch"], shape["heads"], shape["kv_heads"], shape["head_dim"]
        self.shape, self.sizes, self.scale = shape, (b, h, hkv, d), scale
        self.buffers, self.depth = config["buffer_num"], config["pipeline_depth"]
        bq, bkv, bh, buffers = config["block_q"], config["block_kv"], b * h, config["buffer_num"]
        q, k, v = inputs[:3]
        self.q = q.reshape(bh, shape["seq_q"], d)
        # k and v seen per query head, without a copy: [batch, kv_heads, group, seq_kv, d]
        self.k, self.v = (
            t.view(b, hkv, 1, t.shape[2], d).expand(b, hkv, h // hkv, t.shape[2], d) for t in (k, v)
        )
        self.mask = inputs[3] if len(inputs) == 4 else None
        self.out = torch.empty((bh, shape["seq_q"], d), dtype=q.dtype, device=q.device)
        self.lse = torch.empty((bh, shape["seq_q"]), dtype=torch.float32, device=q.device)
        causal, sq, skv = shape["causal"], shape["seq_q"], shape["seq_kv"]
        self.steps = attention_steps(sq, skv, bq, bkv, causal)
        self.slots = [Slots(buffers, bh * n * d, q.dtype, q.device) for n in (bq, bkv, bkv)]
        self.accumulators = Slots(buffers, bh * bq * d, torch.float32, q.device)
        self.low = q.dtype != torch.float32
        self.upcast = Slots(3 if self.low else 0, bh * max(bq, bkv) * d, torch.float32, q.device)
        self.state = OnlineSoftmax.allocate(bh, bq, bkv, q.device)
        self.causal = CausalMask((bq, bkv), sq, skv, causal, q.device) if causal else None
        # a row may see no key: the one-step softmax (torch's) would give NaN there
        self.may_be_empty = self.mask is not None or (causal == CAUSAL_BOTTOM_RIGHT and sq > skv)

    def copy_in(self, step: int, slot: int) -> None:
        """The step's K and V blocks (and, first in its tile, the Q block) into their slots."""
        s, (b, h, hkv, d) = self.steps[step], self.sizes
        q_slots, k_slots, v_slots = self.slots
        if s.first:
            q_slots.view(s.tile % self.buffers, (b * h, s.rows, d)).copy_(self.q[:, s.q])
        size = (b, hkv, h // hkv, s.cols, d)
        k_slots.view(slot, size).copy_(self.k[:, :, :, s.kv])
        v_slots.view(slot, size).copy_(self.v[:, :, :, s.kv])

    def compute(self, step: int, slot: int, out_slot: int) -> None:
        """Scores of the step, masked, folded into the tile's accumulator (finished on its last)."""
        s, (b, h, _, d) = self.steps[step], self.sizes
        bh, (q_slots, k_slots, v_slots) = b * h, self.slots
        q_tile = q_slots.view(out_slot, (bh, s.rows, d))
        k_tile, v_tile = k_slots.view(slot, (bh, s.cols, d)), v_slots.view(slot, (bh, s.cols, d))
        q_local = q_tile
        if self.low:  # compute in float32 on upcast copies
            q_tile = self.upcast.view(0, (bh, s.rows, d))
            k_tile = self.upcast.view(1, (bh, s.cols, d)).copy_(k_tile)
            v_tile = self.upcast.view(2, (bh, s.cols, d)).copy_(v_tile)
        whole = s.first and s.last and not self.may_be_empty
        base = 1.0 if whole else LOG2_E  # the online softmax works in base 2 (exp2 is cheaper than exp)
        if s.first:
            torch.mul(q_local, self.scale * base, out=q_tile)
        acc = self.accumulators.view(out_slot, (bh, s.rows, d))
        scores = self.state.block_scores(q_tile, k_tile)
        if self.mask is not None:
            scores.view(b, h, s.rows, s.cols).add_(self.mask[:, :, s.q, s.kv], alpha=base)
        hidden = self.causal.of(s) if self.causal is not None else None
        if hidden is not None:
            scores.masked_fill_(hidden, float("-inf"))
        lse = self.lse[:, s.q]
        if whole:
            self.state.whole(scores, v_tile, acc, lse)
            return
        self.state.fold(scores, v_tile, acc, first=s.first)
        if s.last:
            self.state.finish(acc, lse)

    def copy_out(self, tile: int, out_slot: int) -> None:
        """The tile's block of O from its accumulator."""
        q_block, d = self.q_blocks[tile], self.sizes[3]
        self.out[:, q_block].copy_(
            self.accumulators.view(out_slot, (self.out.shape[0], q_block.stop - q_block.start, d))
        )

    def run(self) -> AttentionOutputs:
        """Execute the pipeline; ``(out, lse)`` in ``[batch, heads, ...]`` views."""
        self.q_blocks = [s.q for s in self.steps if s.first]
        tile_steps = [sum(1 for s in self.steps if s.tile == t) for t in range(len(self.q_blocks))]
        execute(
            TiledLoop(tile_steps, self.copy_in, self.compute, self.copy_out),
            self.buffers,
            self.depth,
            self.q.device,
        )
        b, h, _, d = self.sizes
        return self.out.view(b, h, self.shape["seq_q"], d), self.lse.view(b, h, self.shape["seq_q"])


SPEC = FusedAttentionSpec()
