"""``rms_norm``: ``y = x / sqrt(mean(x^2, last dim) + eps) * w`` over a ``rows x cols`` matrix: its
portable implementation.

Its declaration (dims, knobs, working set, default rule, counts) is
:mod:`tiletune.kernels.rms_norm.declaration`.

Tiling: the row-wise tiling of :mod:`tiletune.kernels.softmax.portable`
(:class:`RowKernelSpec`). With whole-row tiles (``tile_cols == cols``) a row
tile is one step and the weight ``w`` is copied into local memory once per
call. With column tiles the first pass accumulates each row's sum of squares
(float32) across the column tiles; the second pass copies each column tile in
again with its slice of ``w`` (a third input queue) and writes
``x * rsqrt(sum / cols + eps) * w``.

``eps`` is a call argument (:data:`CALL_ARGUMENTS`), not a key dim: ``run_with``,
``reference_with`` and ``vendor_with`` take the call's, ``run``, ``reference`` and ``vendor`` (the
tuning path) the operator's default, :data:`~tiletune.kernels.rms_norm.declaration.EPS`.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import MappingProxyType

import torch

from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.native.space import NATIVE_BACKEND
from tiletune.kernels.native.spec import native_twin
from tiletune.kernels.pipeline import Slots, TiledLoop, execute, require_backend
from tiletune.kernels.rms_norm import vendor
from tiletune.kernels.rms_norm.declaration import EPS, RmsNormDeclaration
from tiletune.kernels.softmax.portable import RowBuffers, RowKernelSpec, row_plan
from tiletune.kernels.spec import CallArguments, VendorOp, expect_ndim, expect_size, widened

#: The call argument of ``rms_norm`` and its backward, with its default: ``eps``, under the root.
CALL_ARGUMENTS: CallArguments = MappingProxyType({"eps": EPS})


def _accumulate_squares(tile: torch.Tensor, squares: torch.Tensor, block: torch.Tensor, first: bool) -> None:
    """Add each row's sum of squares of ``tile`` to ``squares`` (set it on the ``first`` tile)."""
    norm = squares if first else block
    torch.linalg.vector_norm(tile, 2, -1, keepdim=True, dtype=torch.float32, out=norm)
    if first:
        squares.square_()
    else:
        squares.addcmul_(block, block)


class RmsNormSpec(RmsNormDeclaration, RowKernelSpec):
    """RMS normalisation of each row, scaled by a weight vector of length ``cols``."""

    #: The native rule's time is 0.07-0.72x torch's op's on CPUs at the decoder's keys
    #: (``docs/figures/untuned_choice.json``): an untuned call runs it there.
    rule_beats_vendor = (NATIVE_BACKEND,)

    input_names = ("x", "w")
    call_arguments = CALL_ARGUMENTS

    def shape_of(self, inputs: Sequence[torch.Tensor]) -> Shape:
        """As for every row-wise kernel (``x``'s last dim is ``cols``); ``w`` is a vector of ``cols``."""
        shape = super().shape_of(inputs)
        w = inputs[1]
        expect_ndim("w", w, 1, "a vector of cols weights")
        expect_size("w", w.shape[0], shape["cols"], "its length")
        return shape

    def make_inputs(
        self, shape: Shape, dtype: str, device: torch.device, seed: int = 0
    ) -> tuple[torch.Tensor, ...]:
        """``x`` standard normal, ``w`` uniform in [0.5, 1.5)."""
        (x,) = super().make_inputs(shape, dtype, device, seed)
        generator = torch.Generator().manual_seed(seed + 1)
        w = torch.rand(shape["cols"], generator=generator) + 0.5
        return x, w.to(device, x.dtype)

    def eps_of(self, arguments: CallArguments) -> float:
        """The call's ``eps`` (the default where ``arguments`` leave it out; ``TypeError`` for an
        argument the kernel does not take)."""
        return self.arguments_of(arguments)["eps"]

    def vendor(self, shape: Shape, device_kind: str) -> VendorOp:
        """``F.rms_norm`` (:mod:`tiletune.kernels.rms_norm.vendor`) at the default ``eps``."""
        return vendor.rms_norm(shape, device_kind)

    def vendor_with(self, shape: Shape, device_kind: str, arguments: CallArguments) -> VendorOp:
        """``F.rms_norm`` at the call's ``eps``."""
        return vendor.rms_norm(shape, device_kind, self.eps_of(arguments))

    def reference(self, inputs: Sequence[torch.Tensor], shape: Shape) -> torch.Tensor:
        """The formula at the default ``eps``, in float32 (float64 for float64)."""
        return self.reference_with(inputs, shape, {})

    def reference_with(
        self, inputs: Sequence[torch.Tensor], shape: Shape, arguments: CallArguments
    ) -> torch.Tensor:
        """The formula at the call's ``eps``, in float32 (float64 for float64)."""
        x, w = (widened(t) for t in inputs)
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + self.eps_of(arguments)) * w

    def run(
        self, inputs: Sequence[torch.Tensor], config: Config, shape: Shape, backend: str = "torch"
    ) -> torch.Tensor:
        """:meth:`run_with` at the default ``eps``."""
        return self.run_with(inputs, config, shape, backend, {})

    def run_with(
        self,
        inputs: Sequence[torch.Tensor],
        config: Config,
        shape: Shape,
        backend: str,
        arguments: CallArguments,
    ) -> torch.Tensor:
        """Tiled rms_norm at the call's ``eps`` through the pipeline executor (``native``: the C++ kernel)."""
        eps = self.eps_of(arguments)
        if backend == NATIVE_BACKEND:
            output = native_twin("rms_norm").run_with(inputs, config, shape, NATIVE_BACKEND, arguments)
            assert isinstance(output, torch.Tensor)  # the native twin's forward: one tensor
            return output
        require_backend(self.backends(), backend)
        cols = shape["cols"]
        x, w = inputs[0].reshape(-1, cols), inputs[1]  # rows x cols, whatever the caller's leading dims
        out = torch.empty_like(x)
        plan = row_plan(shape["rows"], cols, config["tile_rows"], config["tile_cols"])
        local = RowBuffers.allocate(x, config)
        whole_w = None if plan.two_pass else w.clone()  # loaded once when rows fit whole
        weights = Slots(config["buffer_num"] if plan.two_pass else 0, config["tile_cols"], w.dtype, w.device)
        steps = plan.steps

        def copy_in(step: int, slot: int) -> None:
            s = steps[step]
            local.inputs.view(slot, s.size).copy_(x[s.rows, s.cols])
            if s.second_pass and whole_w is None:
                weights.view(slot, (s.size[1],)).copy_(w[s.cols])

        def compute(step: int, slot: int, out_slot: int) -> None:
            s = steps[step]
            tile = local.work_in(slot, s.size)
            squares, block = local.stats(s.size)
            if not (plan.two_pass and s.second_pass):  # a first-pass step, or the only step
                _accumulate_squares(tile, squares, block, s.first)
                if plan.two_pass:
                    return
            if s.first:
                squares.div_(cols).add_(eps).rsqrt_()
            weight = whole_w if whole_w is not None else weights.view(slot, (s.size[1],))
            result = local.work_out(out_slot, s.size)
            torch.mul(tile, squares, out=result).mul_(weight)
            local.store(out_slot, s.size)

        def copy_out(tile: int, out_slot: int) -> None:
            s = plan.outputs[tile]
            out[s.rows, s.cols].copy_(local.outputs.view(out_slot, s.size))

        loop = TiledLoop(plan.tile_steps, copy_in, compute, copy_out)
        execute(loop, config["buffer_num"], config["pipeline_depth"], x.device)
        return out.view(inputs[0].shape)


SPEC = RmsNormSpec()
