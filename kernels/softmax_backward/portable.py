"""``softmax_backward``: the gradient of ``softmax`` over the last dim, ``dx = y * (g - sum(g * y))``
per row from the forward's output ``y``: its portable implementation, the reference of the knobs'
meaning.

Its declaration (dims, knobs, working set, default rule, counts) is
:mod:`tiletune.kernels.softmax_backward.declaration`.

Tiling: the row-wise tiling of :mod:`tiletune.kernels.softmax.portable` (:func:`row_plan`,
:class:`RowBuffers`), with a second input queue for ``g``. With whole-row tiles a row tile is one
step: copy-in of ``y`` and ``g``, ``s = sum(g * y)`` per row and ``dx = y * (g - s)`` on the local
tiles, copy-out. With column tiles the first pass accumulates ``s`` (float32) over the column tiles,
and the second copies each column tile of ``y`` and ``g`` in again and writes ``dx``. Float16 and
bfloat16 tiles are computed in float32 scratch: ``y``'s (the input scratch) and ``g``'s (the output
scratch, which ``dx`` then overwrites before it is stored in the output slot).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.errors import ShapeError
from tiletune.kernels.native.space import NATIVE_BACKEND
from tiletune.kernels.native.spec import run_native
from tiletune.kernels.pipeline import Slots, TiledLoop, execute, require_backend
from tiletune.kernels.softmax.portable import RowBuffers, RowKernelSpec, row_plan
from tiletune.kernels.softmax_backward import vendor
from tiletune.kernels.softmax_backward.declaration import SoftmaxBackwardDeclaration
from tiletune.kernels.spec import VendorOp, expect_inputs, torch_dtype, widened


def softmax_gradient(y: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """``y * (g - sum(g * y, -1))`` in float32 (float64 for float64 inputs): the formula, untiled."""
    yf, gf = widened(y), widened(grad)
    return yf * (gf - (gf * yf).sum(-1, keepdim=True))


def _row_sums(y: torch.Tensor, g: torch.Tensor, sums: torch.Tensor, block: torch.Tensor, first: bool) -> None:
    """Add each row's ``sum(g * y)`` of a tile to ``sums`` (set it on the ``first`` tile); ``[rows, 1]``."""
    torch.linalg.vecdot(y, g, dim=-1, out=(sums if first else block).view(-1))
    if not first:
        sums.add_(block)


class SoftmaxBackwardSpec(SoftmaxBackwardDeclaration, RowKernelSpec):
    """``dx = y * (g - sum(g * y))`` over each row, two passes across column tiles."""

    input_names = ("y", "grad")

    def shape_of(self, inputs: Sequence[torch.Tensor]) -> Shape:
        """``cols``: the last dim of ``y``; ``rows``: all its other dims together (1 for a vector);
        ``grad`` must have ``y``'s size."""
        expect_inputs(self.name, inputs, self.input_names)
        y, grad = inputs
        if y.dim() == 0:
            raise ShapeError("inputs.y", "must have at least one dim (the row's elements), got a scalar")
        if grad.shape != y.shape:
            raise ShapeError(
                "inputs.grad", f"must have y's size {list(y.shape)}, got a tensor of size {list(grad.shape)}"
            )
        cols = y.shape[-1]
        return {"rows": y.numel() // cols if cols else 0, "cols": cols}

    def make_inputs(
        self, shape: Shape, dtype: str, device: torch.device, seed: int = 0
    ) -> tuple[torch.Tensor, ...]:
        """``y``: the softmax of a standard normal ``rows x cols`` (valid probabilities per row);
        ``grad``: standard normal."""
        generator = torch.Generator().manual_seed(seed)
        y = torch.softmax(torch.randn((shape["rows"], shape["cols"]), generator=generator), -1)
        grad = torch.randn((shape["rows"], shape["cols"]), generator=generator)
        return y.to(device, torch_dtype(dtype)), grad.to(device, torch_dtype(dtype))

    def vendor(self, shape: Shape, device_kind: str) -> VendorOp | None:
        """torch's softmax backward (:mod:`tiletune.kernels.softmax_backward.vendor`)."""
        return vendor.softmax_backward(shape, device_kind)

    def reference(self, inputs: Sequence[torch.Tensor], shape: Shape) -> torch.Tensor:
        """The formula in float32 (float64 for float64), shaped like ``y``."""
        return softmax_gradient(inputs[0], inputs[1])

    def run(
        self, inputs: Sequence[torch.Tensor], config: Config, shape: Shape, backend: str = "torch"
    ) -> torch.Tensor:
        """Tiled softmax backward through the pipeline executor (``native``: the C++ kernel)."""
        if backend == NATIVE_BACKEND:
            return run_native("softmax_backward", inputs, config, shape)
        require_backend(self.backends(), backend)
        cols = shape["cols"]
        y, g = (t.reshape(-1, cols) for t in inputs)  # rows x cols, whatever the caller's leading dims
        out = torch.empty_like(y)
        plan = row_plan(shape["rows"], cols, config["tile_rows"], config["tile_cols"])
        local = RowBuffers.allocate(y, config)
        grads = Slots(config["buffer_num"], config["tile_rows"] * config["tile_cols"], g.dtype, g.device)
        steps = plan.steps

        def copy_in(step: int, slot: int) -> None:
            s = steps[step]
            local.inputs.view(slot, s.size).copy_(y[s.rows, s.cols])
            grads.view(slot, s.size).copy_(g[s.rows, s.cols])

        def compute(step: int, slot: int, out_slot: int) -> None:
            s = steps[step]
            y_tile = local.work_in(slot, s.size)
            g_tile = grads.view(slot, s.size)
            result = local.work_out(out_slot, s.size)  # g's float32 scratch, or (float32) the output slot
            if local.scratch_out is not None:
                g_tile = result.copy_(g_tile)
            sums, block = local.stats(s.size)
            if not (plan.two_pass and s.second_pass):  # a first-pass step, or the only step
                _row_sums(y_tile, g_tile, sums, block, s.first)
                if plan.two_pass:
                    return
            torch.sub(g_tile, sums, out=result).mul_(y_tile)
            local.store(out_slot, s.size)

        def copy_out(tile: int, out_slot: int) -> None:
            s = plan.outputs[tile]
            out[s.rows, s.cols].copy_(local.outputs.view(out_slot, s.size))

        loop = TiledLoop(plan.tile_steps, copy_in, compute, copy_out)
        execute(loop, config["buffer_num"], config["pipeline_depth"], y.device)
        return out.view(inputs[0].shape)


SPEC = SoftmaxBackwardSpec()
