"""``matmul``: ``C[m, n] = A[m, k] @ B[k, n]``, accumulated in float32: its portable implementation.

Its declaration (dims, knobs, working set, default rule, counts) is
:mod:`tiletune.kernels.matmul.declaration`.

Operand layouts: :func:`layout` is the one rule every implementation applies to ``a`` and ``b``
(and ``shape_of`` reports): a row-major operand is read as it is (flag 0), the transpose of a
row-major matrix is read in place (flag 1, ``a_transposed`` / ``b_transposed``), any other
strides are made contiguous first (flag 0).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.matmul import vendor
from tiletune.kernels.matmul.declaration import MatmulDeclaration
from tiletune.kernels.native.space import NATIVE_BACKEND
from tiletune.kernels.native.spec import native_backends, run_native
from tiletune.kernels.pipeline import Slots, TiledLoop, execute, require_backend
from tiletune.kernels.spec import (
    KernelSpec,
    VendorOp,
    expect_inputs,
    expect_ndim,
    expect_size,
    torch_dtype,
    widened,
)


def layout(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The matrix ``t`` as a matmul implementation reads it, and its transposed flag.

    ``(t, 0)`` when ``t`` is contiguous (row-major); ``(t, 1)`` when ``t.t()`` is contiguous (``t``
    has strides ``(1, rows)``: read in place as the transpose of a row-major matrix); otherwise
    ``(t.contiguous(), 0)``, a row-major copy. A matrix that is both (a single row or column, or
    empty) is row-major.
    """
    if t.is_contiguous():
        return t, 0
    if t.t().is_contiguous():
        return t, 1
    return t.contiguous(), 0


def _as_layout(t: torch.Tensor, transposed: int) -> torch.Tensor:
    """``t`` (row-major) with the layout ``transposed`` says: the same values, strides ``(1, rows)``
    for 1 (the transpose of a row-major copy)."""
    return t.t().contiguous().t() if transposed else t


def _blocks(length: int, tile: int) -> list[slice]:
    return [slice(start, min(length, start + tile)) for start in range(0, length, tile)]


class MatmulSpec(MatmulDeclaration, KernelSpec):
    """Tiled GEMM with a k loop per output tile."""

    def backends(self) -> tuple[str, ...]:
        """``torch`` (portable), and ``native`` (the C++ CPU kernel) where it is built here."""
        return native_backends()

    def shape_of(self, inputs: Sequence[torch.Tensor]) -> Shape:
        """``m`` and ``k`` from ``A [m, k]``, ``n`` from ``B [k, n]``; ``a_transposed`` and
        ``b_transposed`` from their strides (:func:`layout`)."""
        expect_inputs(self.name, inputs, ("a", "b"))
        a, b = inputs
        expect_ndim("a", a, 2, "a matrix [m, k]")
        expect_ndim("b", b, 2, "a matrix [k, n]")
        expect_size("b", b.shape[0], a.shape[1], "its first dim (k)")
        return {
            "m": a.shape[0],
            "n": b.shape[1],
            "k": a.shape[1],
            "a_transposed": layout(a)[1],
            "b_transposed": layout(b)[1],
        }

    def make_inputs(
        self, shape: Shape, dtype: str, device: torch.device, seed: int = 0
    ) -> tuple[torch.Tensor, ...]:
        """``A`` and ``B`` standard normal, scaled by ``k ** -0.25`` so ``C`` stays O(1), in the layout
        the shape names: an operand whose flag is 1 is the ``.t()`` of a contiguous ``[k, m]``
        (``[n, k]``) tensor. The values do not depend on the flags."""
        generator = torch.Generator().manual_seed(seed)
        scale = shape["k"] ** -0.25
        a = torch.randn((shape["m"], shape["k"]), generator=generator) * scale
        b = torch.randn((shape["k"], shape["n"]), generator=generator) * scale
        a, b = (t.to(device, torch_dtype(dtype)) for t in (a, b))
        return _as_layout(a, shape.get("a_transposed", 0)), _as_layout(b, shape.get("b_transposed", 0))

    def vendor(self, shape: Shape, device_kind: str) -> VendorOp | None:
        """``torch.matmul`` (:mod:`tiletune.kernels.matmul.vendor`)."""
        return vendor.matmul(shape, device_kind)

    def reference(self, inputs: Sequence[torch.Tensor], shape: Shape) -> torch.Tensor:
        """``A @ B`` in float32 (float64 for float64)."""
        a, b = inputs
        return widened(a) @ widened(b)

    def run(
        self, inputs: Sequence[torch.Tensor], config: Config, shape: Shape, backend: str = "torch"
    ) -> torch.Tensor:
        """Tiled matmul through the pipeline executor (``native``: the C++ kernel); a transposed operand
        is read in place, a copy-in taking its tile from the view."""
        if backend == NATIVE_BACKEND:
            return run_native("matmul", inputs, config, shape)
        require_backend(self.backends(), backend)
        (a, _), (b, _) = (layout(t) for t in inputs)  # tiles are copied from the views, strides as they are
        tm, tn, tk, buffers = (config[k] for k in ("tile_m", "tile_n", "tile_k", "buffer_num"))
        c = torch.empty((shape["m"], shape["n"]), dtype=a.dtype, device=a.device)
        k_blocks = _blocks(shape["k"], tk)
        outputs = [(i, j) for i in _blocks(shape["m"], tm) for j in _blocks(shape["n"], tn)]
        steps = [(i, j, kk, q == 0) for i, j in outputs for q, kk in enumerate(k_blocks)]
        a_slots, b_slots = (
            Slots(buffers, tm * tk, a.dtype, a.device),
            Slots(buffers, tk * tn, a.dtype, a.device),
        )
        accumulators = Slots(buffers, tm * tn, torch.float32, a.device)
        low = a.dtype != torch.float32
        scratch = Slots(2 if low else 0, max(tm, tn) * tk, torch.float32, a.device)

        def sizes(i: slice, j: slice, kk: slice) -> tuple[tuple[int, int], tuple[int, int]]:
            return (i.stop - i.start, kk.stop - kk.start), (kk.stop - kk.start, j.stop - j.start)

        def copy_in(step: int, slot: int) -> None:
            i, j, kk, _ = steps[step]
            a_size, b_size = sizes(i, j, kk)
            a_slots.view(slot, a_size).copy_(a[i, kk])
            b_slots.view(slot, b_size).copy_(b[kk, j])

        def compute(step: int, slot: int, out_slot: int) -> None:
            i, j, kk, first = steps[step]
            a_size, b_size = sizes(i, j, kk)
            a_tile, b_tile = a_slots.view(slot, a_size), b_slots.view(slot, b_size)
            if low:
                a_tile = scratch.view(0, a_size).copy_(a_tile)
                b_tile = scratch.view(1, b_size).copy_(b_tile)
            acc = accumulators.view(out_slot, (a_size[0], b_size[1]))
            if first:
                torch.mm(a_tile, b_tile, out=acc)
            else:
                acc.addmm_(a_tile, b_tile)

        def copy_out(tile: int, out_slot: int) -> None:
            i, j = outputs[tile]
            c[i, j].copy_(accumulators.view(out_slot, (i.stop - i.start, j.stop - j.start)))

        loop = TiledLoop([len(k_blocks)] * len(outputs), copy_in, compute, copy_out)
        execute(loop, buffers, config["pipeline_depth"], a.device)
        return c


SPEC = MatmulSpec()
