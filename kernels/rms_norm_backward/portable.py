"""``rms_norm_backward``: the gradients ``(dx, dw)`` of ``y = x * rsqrt(mean(x^2) + eps) * w``, its
portable implementation.

Its declaration (dims, knobs, working set, default rule, counts) is
:mod:`tiletune.kernels.rms_norm_backward.declaration`.

Math: with ``r = rsqrt(mean(x^2) + eps)`` per row, ``x̂ = x r`` and the output's gradient ``g``:
``dx = r * (g w - x̂ * mean(g w x̂)) = r g w - x * c`` with ``c = r^3 sum(g w x) / cols``, and
``dw = sum over rows of g x̂``.

Tiling: the row-wise tiling of :mod:`tiletune.kernels.softmax.portable` (:func:`row_plan`). With
whole-row tiles (``tile_cols == cols``) a row tile is one step: ``x`` and ``grad`` copied in, both
row statistics (``sum(x^2)``, ``sum(g w x)``, float32), then the ``dx`` tile; ``w`` is copied into
local memory once per call. With column tiles the first pass copies each column tile of ``x`` and
``grad`` in with its slice of ``w`` (a third input queue) and accumulates the statistics; the second
pass copies them in again and writes each column tile of ``dx``. Every output step adds its tile's
``g x̂`` summed over its rows to the float32 ``dw`` sums (one core here: its partial sums are the
result), in step order.

``eps`` is the forward's, a call argument (``rms_norm``'s
:data:`~tiletune.kernels.rms_norm.portable.CALL_ARGUMENTS`), not a key dim: ``run_with``,
``reference_with`` and ``vendor_with`` take the call's, ``run``, ``reference`` and ``vendor`` (the
tuning path) the operator's default.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.errors import ShapeError
from tiletune.kernels.native.space import NATIVE_BACKEND
from tiletune.kernels.native.spec import native_twin
from tiletune.kernels.pipeline import Slots, TiledLoop, execute, require_backend
from tiletune.kernels.rms_norm.portable import CALL_ARGUMENTS
from tiletune.kernels.rms_norm_backward import vendor
from tiletune.kernels.rms_norm_backward.declaration import RmsNormBackwardDeclaration
from tiletune.kernels.rms_norm_backward.formula import gradients
from tiletune.kernels.softmax.portable import RowBuffers, RowKernelSpec, RowStep, row_plan
from tiletune.kernels.spec import CallArguments, VendorOp, expect_ndim, expect_size

#: The gradients, in the order ``run`` and ``reference`` return them.
OUTPUT_NAMES = ("dx", "dw")


@dataclass
class GradBuffers:
    """The local memory ``rms_norm_backward`` adds to a row-wise kernel's (:class:`RowBuffers`: the
    ``x`` queue, the ``dx`` queue, ``sum(x^2)`` running and per block, float32 scratch of both
    tiles): the ``grad`` queue and its float32 scratch, ``sum(g w x)`` running and per block, a
    float32 tile of products, and one column tile's block of ``dw`` sums."""

    grads: Slots
    grad_scratch: torch.Tensor | None
    gwx: torch.Tensor
    gwx_block: torch.Tensor
    product: torch.Tensor
    dw_block: torch.Tensor

    @classmethod
    def allocate(cls, grad: torch.Tensor, config: Config) -> GradBuffers:
        """Buffers for ``config``'s tiles: the queue in ``grad``'s dtype, the rest float32."""
        rows, tile = config["tile_rows"], config["tile_rows"] * config["tile_cols"]

        def f32(size: int) -> torch.Tensor:
            return torch.empty(size, dtype=torch.float32, device=grad.device)

        low = grad.dtype != torch.float32
        return cls(
            Slots(config["buffer_num"], tile, grad.dtype, grad.device),
            f32(tile) if low else None,
            f32(rows),
            f32(rows),
            f32(tile),
            f32(config["tile_cols"]),
        )

    def work_in(self, slot: int, size: tuple[int, int]) -> torch.Tensor:
        """The ``grad`` slot as float32: the slot itself, or its float32 copy in scratch."""
        tile = self.grads.view(slot, size)
        if self.grad_scratch is None:
            return tile
        return self.grad_scratch[: math.prod(size)].view(size).copy_(tile)

    def stats(self, size: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """``sum(g w x)`` running and per block, ``[rows, 1]`` each."""
        return self.gwx[: size[0]].view(size[0], 1), self.gwx_block[: size[0]].view(size[0], 1)

    def products(self, size: tuple[int, int]) -> torch.Tensor:
        """The float32 product scratch seen as a tile of ``size``."""
        return self.product[: math.prod(size)].view(size)


def _row_sum(terms: torch.Tensor, running: torch.Tensor, block: torch.Tensor, first: bool) -> None:
    """Add each row's sum of ``terms`` to ``running`` (set it on the ``first`` tile)."""
    torch.sum(terms, -1, keepdim=True, out=running if first else block)
    if not first:
        running.add_(block)


class RmsNormBackwardSpec(RmsNormBackwardDeclaration, RowKernelSpec):
    """The gradients ``(dx, dw)`` of ``rms_norm`` for the output's gradient ``grad``."""

    #: The native rule's time is 0.05-0.26x torch's op's on CPUs at the decoder's keys
    #: (``docs/figures/untuned_choice.json``): an untuned call runs it there.
    rule_beats_vendor = (NATIVE_BACKEND,)

    input_names = ("x", "w", "grad")
    call_arguments = CALL_ARGUMENTS

    def shape_of(self, inputs: Sequence[torch.Tensor]) -> Shape:
        """As for every row-wise kernel (``x``'s last dim is ``cols``); ``w`` is a vector of ``cols``,
        ``grad`` has ``x``'s size."""
        shape = super().shape_of(inputs)
        x, w, grad = inputs
        expect_ndim("w", w, 1, "a vector of cols weights")
        expect_size("w", w.shape[0], shape["cols"], "its length")
        if grad.shape != x.shape:
            raise ShapeError("inputs.grad", f"must have x's size {list(x.shape)}, got {list(grad.shape)}")
        return shape

    def make_inputs(
        self, shape: Shape, dtype: str, device: torch.device, seed: int = 0
    ) -> tuple[torch.Tensor, ...]:
        """``x`` standard normal, ``w`` uniform in [0.5, 1.5) (as ``rms_norm`` makes them), ``grad``
        standard normal."""
        (x,) = super().make_inputs(shape, dtype, device, seed)
        w = torch.rand(shape["cols"], generator=torch.Generator().manual_seed(seed + 1)) + 0.5
        grad = torch.randn(x.shape, generator=torch.Generator().manual_seed(seed + 2))
        return x, w.to(device, x.dtype), grad.to(device, x.dtype)

    def eps_of(self, arguments: CallArguments) -> float:
        """The forward's ``eps`` (the default where ``arguments`` leave it out; ``TypeError`` for an
        argument the kernel does not take)."""
        return self.arguments_of(arguments)["eps"]

    def vendor(self, shape: Shape, device_kind: str) -> VendorOp | None:
        """The gradients autograd computes for ``F.rms_norm``
        (:mod:`tiletune.kernels.rms_norm_backward.vendor`), at the default ``eps``."""
        return vendor.rms_norm_backward(shape, device_kind)

    def vendor_with(self, shape: Shape, device_kind: str, arguments: CallArguments) -> VendorOp | None:
        """The gradients autograd computes for ``F.rms_norm`` at the call's ``eps``."""
        return vendor.rms_norm_backward(shape, device_kind, self.eps_of(arguments))

    def reference(self, inputs: Sequence[torch.Tensor], shape: Shape) -> tuple[torch.Tensor, torch.Tensor]:
        """``(dx, dw)`` by the formula (:mod:`tiletune.kernels.rms_norm_backward.formula`) at the
        default ``eps``, in float32 (float64 for float64)."""
        return self.reference_with(inputs, shape, {})

    def reference_with(
        self, inputs: Sequence[torch.Tensor], shape: Shape, arguments: CallArguments
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(dx, dw)`` by the formula at the call's ``eps``, in float32 (float64 for float64)."""
        x, w, grad = inputs
        return gradients(x, w, grad, self.eps_of(arguments))

    def run(
        self, inputs: Sequence[torch.Tensor], config: Config, shape: Shape, backend: str = "torch"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`run_with` at the default ``eps``."""
        return self.run_with(inputs, config, shape, backend, {})

    def run_with(
        self,
        inputs: Sequence[torch.Tensor],
        config: Config,
        shape: Shape,
        backend: str,
        arguments: CallArguments,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(dx, dw)`` at the call's ``eps`` through the pipeline executor (``native``: the C++ kernel)."""
        eps = self.eps_of(arguments)
        if backend == NATIVE_BACKEND:
            native = native_twin("rms_norm_backward")
            dx, dw = native.run_with(inputs, config, shape, NATIVE_BACKEND, arguments)
            return dx, dw
        require_backend(self.backends(), backend)
        cols = shape["cols"]
        x, w, grad = inputs[0].reshape(-1, cols), inputs[1], inputs[2].reshape(-1, cols)
        dx = torch.empty_like(x)
        dw = torch.zeros(cols, dtype=torch.float32, device=x.device)  # the one core's partial sums
        if x.numel() > 0:
            execute(
                self._loop(x, w, grad, dx=dx, dw=dw, config=config, shape=shape, eps=eps),
                config["buffer_num"],
                config["pipeline_depth"],
                x.device,
            )
        return dx.view(inputs[0].shape), dw.to(w.dtype)

    def _loop(
        self,
        x: torch.Tensor,
        w: torch.Tensor,
        grad: torch.Tensor,
        *,
        dx: torch.Tensor,
        dw: torch.Tensor,
        config: Config,
        shape: Shape,
        eps: float,
    ) -> TiledLoop:
        """The stages of one call on ``rows x cols`` matrices at ``eps``: ``dx`` written, ``dw``
        accumulated."""
        cols = shape["cols"]
        plan = row_plan(shape["rows"], cols, config["tile_rows"], config["tile_cols"])
        local, extra = RowBuffers.allocate(x, config), GradBuffers.allocate(grad, config)
        whole_w = None if plan.two_pass else w.clone()  # loaded once when rows fit whole
        weights = Slots(config["buffer_num"] if plan.two_pass else 0, config["tile_cols"], w.dtype, w.device)
        steps = plan.steps

        def copy_in(step: int, slot: int) -> None:
            s = steps[step]
            local.inputs.view(slot, s.size).copy_(x[s.rows, s.cols])
            extra.grads.view(slot, s.size).copy_(grad[s.rows, s.cols])
            if whole_w is None:
                weights.view(slot, (s.size[1],)).copy_(w[s.cols])

        def compute(step: int, slot: int, out_slot: int) -> None:
            s = steps[step]
            weight = whole_w if whole_w is not None else weights.view(slot, (s.size[1],))
            tile, g = local.work_in(slot, s.size), extra.work_in(slot, s.size)
            squares, squares_block = local.stats(s.size)
            gwx, gwx_block = extra.stats(s.size)
            product = extra.products(s.size)
            if not (plan.two_pass and s.second_pass):  # a first-pass step, or the only step
                _row_sum(torch.mul(tile, tile, out=product), squares, squares_block, s.first)
                torch.mul(g, weight, out=product).mul_(tile)
                _row_sum(product, gwx, gwx_block, s.first)
                if plan.two_pass:
                    return
            if s.first:  # r = rsqrt(mean(x^2) + eps); c = r^3 sum(g w x) / cols
                squares.div_(cols).add_(eps).rsqrt_()
                gwx.mul_(squares).mul_(squares).mul_(squares).div_(cols)
            result = local.work_out(out_slot, s.size)
            torch.mul(g, weight, out=result).mul_(squares).addcmul_(tile, gwx, value=-1.0)
            local.store(out_slot, s.size)
            _add_dw(dw, extra, s, torch.mul(tile, squares, out=product).mul_(g))

        def copy_out(tile: int, out_slot: int) -> None:
            s = plan.outputs[tile]
            dx[s.rows, s.cols].copy_(local.outputs.view(out_slot, s.size))

        return TiledLoop(plan.tile_steps, copy_in, compute, copy_out)


def _add_dw(dw: torch.Tensor, extra: GradBuffers, step: RowStep, terms: torch.Tensor) -> None:
    """Add the tile's ``g x̂`` (``terms``) summed over its rows to ``dw``'s columns of the step."""
    block = extra.dw_block[: step.size[1]]
    torch.sum(terms, 0, out=block)
    dw[step.cols].add_(block)


SPEC = RmsNormBackwardSpec()
