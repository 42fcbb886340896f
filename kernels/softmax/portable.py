"""``softmax`` over the last dim of a ``rows x cols`` matrix, and the row-wise tiling it shares: its
portable implementation.

Its declaration (dims, knobs, working set, default rule, counts) is
:mod:`tiletune.kernels.softmax.declaration`.

The row-wise tiling (two passes over column tiles when ``tile_cols < cols``) is the
declaration's, shared with ``rms_norm`` through :class:`RowKernelSpec`. Softmax's first pass is
the online softmax: the running (max, rescaled sum) pair per row, kept as its log-sum-exp
``m + log(l)`` so that folding in a column tile is ``logaddexp`` (which rescales by the running
max); the second pass writes ``exp(x - lse)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.errors import ShapeError
from tiletune.kernels.native.space import NATIVE_BACKEND
from tiletune.kernels.native.spec import native_backends, run_native
from tiletune.kernels.pipeline import Slots, TiledLoop, execute, require_backend
from tiletune.kernels.softmax import vendor
from tiletune.kernels.softmax.declaration import RowKernelDeclaration, SoftmaxDeclaration
from tiletune.kernels.spec import KernelSpec, VendorOp, expect_inputs, torch_dtype, widened


@dataclass(frozen=True)
class RowStep:
    """One step of a row-wise loop: which block of the matrix, which pass, first of its pass."""

    rows: slice
    cols: slice
    size: tuple[int, int]
    second_pass: bool
    first: bool


@dataclass(frozen=True)
class RowPlan:
    """The steps and output tiles of a row-wise kernel for one shape and config."""

    steps: list[RowStep]
    tile_steps: list[int]
    outputs: list[RowStep]
    two_pass: bool


def row_plan(rows: int, cols: int, tile_rows: int, tile_cols: int) -> RowPlan:
    """Steps of every row tile: one whole-row step, or two passes over the column tiles.

    In the two-pass case an output tile is a second-pass step; the first one of a
    row tile also owns the first pass (its step count includes it).
    """
    steps: list[RowStep] = []
    tile_steps: list[int] = []
    outputs: list[RowStep] = []
    col_starts = range(0, cols, tile_cols)
    two_pass = len(col_starts) > 1
    for r0 in range(0, rows, tile_rows):
        r = slice(r0, min(rows, r0 + tile_rows))
        blocks = [slice(c0, min(cols, c0 + tile_cols)) for c0 in col_starts]
        size = [(r.stop - r.start, c.stop - c.start) for c in blocks]
        if two_pass:
            steps += [
                RowStep(r, c, s, False, i == 0) for i, (c, s) in enumerate(zip(blocks, size, strict=True))
            ]
            tile_steps += [len(blocks) + 1] + [1] * (len(blocks) - 1)
        else:
            tile_steps.append(1)
        second = [RowStep(r, c, s, True, i == 0) for i, (c, s) in enumerate(zip(blocks, size, strict=True))]
        steps += second
        outputs += second
    return RowPlan(steps, tile_steps, outputs, two_pass)


class RowKernelSpec(RowKernelDeclaration, KernelSpec):
    """A row-wise kernel over a ``rows x cols`` matrix, tiled ``tile_rows x tile_cols``: the torch
    half of :class:`~tiletune.kernels.softmax.declaration.RowKernelDeclaration` (inputs, backends).

    Subclasses give the name, the per-row state in the working set
    (``_state_bytes``, in their declaration) and ``run``.
    """

    #: The tensors ``run`` takes, in order (``x`` first).
    input_names: tuple[str, ...] = ("x",)

    def backends(self) -> tuple[str, ...]:
        """``torch`` (portable), and ``native`` (the C++ CPU kernel) where it is built here."""
        return native_backends()

    def shape_of(self, inputs: Sequence[torch.Tensor]) -> Shape:
        """``cols``: the last dim of ``x``; ``rows``: all its other dims together (1 for a vector)."""
        expect_inputs(self.name, inputs, self.input_names)
        x = inputs[0]
        if x.dim() == 0:
            raise ShapeError("inputs.x", "must have at least one dim (the row's elements), got a scalar")
        cols = x.shape[-1]
        return {"rows": x.numel() // cols if cols else 0, "cols": cols}

    def make_inputs(
        self, shape: Shape, dtype: str, device: torch.device, seed: int = 0
    ) -> tuple[torch.Tensor, ...]:
        """``x``: standard normal ``rows x cols``."""
        generator = torch.Generator().manual_seed(seed)
        x = torch.randn((shape["rows"], shape["cols"]), generator=generator)
        return (x.to(device, torch_dtype(dtype)),)


@dataclass
class RowBuffers:
    """The local memory of one row-wise run: queues, float32 per-row statistics, scratch."""

    inputs: Slots
    outputs: Slots
    stat: torch.Tensor
    stat_block: torch.Tensor
    scratch_in: torch.Tensor | None
    scratch_out: torch.Tensor | None

    @classmethod
    def allocate(cls, x: torch.Tensor, config: Config) -> RowBuffers:
        """Queues in ``x``'s dtype; statistics ``[tile_rows, 1]`` and (low precision) scratch in float32."""
        rows, tile = config["tile_rows"], config["tile_rows"] * config["tile_cols"]
        buffers, device = config["buffer_num"], x.device

        def f32(size: int) -> torch.Tensor:
            return torch.empty(size, dtype=torch.float32, device=device)

        low = x.dtype != torch.float32
        return cls(
            Slots(buffers, tile, x.dtype, device),
            Slots(buffers, tile, x.dtype, device),
            f32(rows),
            f32(rows),
            f32(tile) if low else None,
            f32(tile) if low else None,
        )

    def work_in(self, slot: int, size: tuple[int, int]) -> torch.Tensor:
        """Input slot as float32: the slot itself, or its float32 copy in scratch."""
        tile = self.inputs.view(slot, size)
        if self.scratch_in is None:
            return tile
        return self.scratch_in[: math.prod(size)].view(size).copy_(tile)

    def work_out(self, slot: int, size: tuple[int, int]) -> torch.Tensor:
        """Where compute writes a float32 result: the output slot, or scratch (then :meth:`store`)."""
        if self.scratch_out is None:
            return self.outputs.view(slot, size)
        return self.scratch_out[: math.prod(size)].view(size)

    def store(self, slot: int, size: tuple[int, int]) -> None:
        """Move a scratch result into the output slot (a no-op for float32)."""
        if self.scratch_out is not None:
            self.outputs.view(slot, size).copy_(self.scratch_out[: math.prod(size)].view(size))

    def stats(self, size: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The running statistic and the block statistic, ``[rows, 1]`` each."""
        return self.stat[: size[0]].view(size[0], 1), self.stat_block[: size[0]].view(size[0], 1)


class SoftmaxSpec(SoftmaxDeclaration, RowKernelSpec):
    """Softmax over each row, with online softmax across column tiles."""

    def vendor(self, shape: Shape, device_kind: str) -> VendorOp | None:
        """``torch.softmax`` (:mod:`tiletune.kernels.softmax.vendor`)."""
        return vendor.softmax(shape, device_kind)

    def reference(self, inputs: Sequence[torch.Tensor], shape: Shape) -> torch.Tensor:
        """``torch.softmax`` in float32 (float64 for float64)."""
        return torch.softmax(widened(inputs[0]), dim=-1)

    def run(
        self, inputs: Sequence[torch.Tensor], config: Config, shape: Shape, backend: str = "torch"
    ) -> torch.Tensor:
        """Tiled softmax through the pipeline executor (``native``: the C++ kernel)."""
        if backend == NATIVE_BACKEND:
            return run_native("softmax", inputs, config, shape)
        require_backend(self.backends(), backend)
        x = inputs[0].reshape(-1, shape["cols"])  # rows x cols, whatever the caller's leading dims
        out = torch.empty_like(x)
        plan = row_plan(shape["rows"], shape["cols"], config["tile_rows"], config["tile_cols"])
        local = RowBuffers.allocate(x, config)
        steps = plan.steps

        def copy_in(step: int, slot: int) -> None:
            s = steps[step]
            local.inputs.view(slot, s.size).copy_(x[s.rows, s.cols])

        def compute(step: int, slot: int, out_slot: int) -> None:
            s = steps[step]
            if not plan.two_pass:
                torch.softmax(local.inputs.view(slot, s.size), -1, out=local.outputs.view(out_slot, s.size))
                return
            lse, lse_block = local.stats(s.size)
            tile = local.work_in(slot, s.size)
            if not s.second_pass:
                torch.logsumexp(tile, -1, keepdim=True, out=lse if s.first else lse_block)
                if not s.first:
                    torch.logaddexp(lse, lse_block, out=lse)
                return
            result = local.work_out(out_slot, s.size)
            torch.sub(tile, lse, out=result).exp_()
            local.store(out_slot, s.size)

        def copy_out(tile: int, out_slot: int) -> None:
            s = plan.outputs[tile]
            out[s.rows, s.cols].copy_(local.outputs.view(out_slot, s.size))

        execute(
            TiledLoop(plan.tile_steps, copy_in, compute, copy_out),
            config["buffer_num"],
            config["pipeline_depth"],
            x.device,
        )
        return out.view(inputs[0].shape)


SPEC = SoftmaxSpec()
