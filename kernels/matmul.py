"""``matmul``: ``C[m, n] = A[m, k] @ B[k, n]``, accumulated in float32.

Tiling: output tiles ``tile_m x tile_n`` in row-major order; each takes one
step per ``tile_k`` slice of ``k``. A step copies ``A[i, kk]`` and
``B[kk, j]`` into their input slots and accumulates their product into the
tile's float32 accumulator (one per output slot, like the cube unit's L0C);
copy-out converts the accumulator to the output dtype. For float16/bfloat16
the compute stage upcasts the two input tiles into float32 scratch first.

Working set: ``buffer_num * (tile_m*tile_k + tile_k*tile_n) * element size``
(input queues) ``+ buffer_num * tile_m*tile_n * 4`` (accumulators) ``+``
low-precision scratch.

Default (the hand-written rule, ``total = m * n``, the output elements):
``heuristic_tiling`` gives tile elements ``E``; ``tile_m``, ``tile_n`` and
``tile_k`` all take the square side ``pow2_floor(sqrt(E))``, each snapped
down to its knob values; buffers and depth as the rule says. For
``total <= 1024`` every tile knob takes its whole dim (``tile_k`` at most 512,
the largest knob value).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from tiletune.client.space import Dim, Knob, snap_down
from tiletune.kernels.native_spec import NATIVE_BACKEND, native_backends, run_native
from tiletune.kernels.pipeline import Slots, TiledLoop, execute, require_backend
from tiletune.kernels.spec import (
    BUFFER_NUM,
    PIPELINE_DEPTH,
    Config,
    DeviceLimits,
    KernelSpec,
    Shape,
    element_size,
    expect_inputs,
    expect_ndim,
    expect_size,
    float32_copies,
    heuristic_tiling,
    pow2_floor,
    torch_dtype,
)

TILES = tuple(1 << p for p in range(4, 10))
FLOAT32_BYTES = 4


def _blocks(length: int, tile: int) -> list[slice]:
    return [slice(start, min(length, start + tile)) for start in range(0, length, tile)]


class MatmulSpec(KernelSpec):
    """Tiled GEMM with a k loop per output tile."""

    name = "matmul"
    version = 1
    description = "C = A @ B with A m x k and B k x n, float32 accumulation"
    dims = (Dim("m", "rows of A and C"), Dim("n", "columns of B and C"), Dim("k", "the reduced dim"))
    knobs: tuple[Knob, ...] = (
        Knob("tile_m", TILES, "rows of an output tile", clamp_to="m"),
        Knob("tile_n", TILES, "columns of an output tile", clamp_to="n"),
        Knob("tile_k", TILES, "depth of one k step", clamp_to="k"),
        BUFFER_NUM,
        PIPELINE_DEPTH,
    )

    def backends(self) -> tuple[str, ...]:
        """``torch`` (portable), and ``native`` (the C++ CPU kernel) where it is built here."""
        return native_backends()

    def working_set_bytes(self, config: Config, shape: Shape, dtype: str) -> int:
        """Input queues for A and B tiles, float32 accumulators per output slot, low-precision scratch."""
        tm, tn, tk, buffers = (config[k] for k in ("tile_m", "tile_n", "tile_k", "buffer_num"))
        inputs = tm * tk + tk * tn
        scratch = 0 if torch_dtype(dtype) == torch.float32 else inputs * FLOAT32_BYTES
        return buffers * inputs * element_size(dtype) + buffers * tm * tn * FLOAT32_BYTES + scratch

    def default_config(self, shape: Shape, dtype: str, limits: DeviceLimits) -> Config:
        """Square tiles of the rule's tile elements (whole dims for tiny problems)."""
        rule = heuristic_tiling(shape["m"] * shape["n"], element_size(dtype), limits.local_memory_bytes)
        values = self.knob_values(shape)
        small = shape["m"] * shape["n"] <= 1024  # the rule's "one tile of everything"
        side = pow2_floor(math.sqrt(rule.tile_elements))
        tiles = {
            knob: snap_down(shape[dim] if small else side, values[knob])
            for knob, dim in (("tile_m", "m"), ("tile_n", "n"), ("tile_k", "k"))
        }
        return {**tiles, "buffer_num": rule.buffer_num, "pipeline_depth": rule.pipeline_depth}

    def shape_of(self, inputs: Sequence[torch.Tensor]) -> Shape:
        """``m`` and ``k`` from ``A [m, k]``, ``n`` from ``B [k, n]``."""
        expect_inputs(self.name, inputs, ("a", "b"))
        a, b = inputs
        expect_ndim("a", a, 2, "a matrix [m, k]")
        expect_ndim("b", b, 2, "a matrix [k, n]")
        expect_size("b", b.shape[0], a.shape[1], "its first dim (k)")
        return {"m": a.shape[0], "n": b.shape[1], "k": a.shape[1]}

    def make_inputs(
        self, shape: Shape, dtype: str, device: torch.device, seed: int = 0
    ) -> tuple[torch.Tensor, ...]:
        """``A`` and ``B`` standard normal, scaled by ``k ** -0.25`` so ``C`` stays O(1)."""
        generator = torch.Generator().manual_seed(seed)
        scale = shape["k"] ** -0.25
        a = torch.randn((shape["m"], shape["k"]), generator=generator) * scale
        b = torch.randn((shape["k"], shape["n"]), generator=generator) * scale
        return a.to(device, torch_dtype(dtype)), b.to(device, torch_dtype(dtype))

    def reference(self, inputs: Sequence[torch.Tensor], shape: Shape) -> torch.Tensor:
        """``A @ B`` in float32."""
        a, b = inputs
        return a.float() @ b.float()

    def run(
        self, inputs: Sequence[torch.Tensor], config: Config, shape: Shape, backend: str = "torch"
    ) -> torch.Tensor:
        """Tiled matmul through the pipeline executor (``native``: the C++ kernel)."""
        if backend == NATIVE_BACKEND:
            return run_native("matmul", inputs, config, shape)
        require_backend(self.backends(), backend)
        a, b = inputs
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

    def flops(self, shape: Shape) -> float:
        """A multiply and an add per (m, n, k) triple."""
        return 2.0 * shape["m"] * shape["n"] * shape["k"]

    def bytes_moved(self, shape: Shape, dtype: str) -> float:
        """Read A and B once, write C once."""
        m, n, k = shape["m"], shape["n"], shape["k"]
        return float((m * k + k * n + m * n) * element_size(dtype))

    def tensor_bytes(self, shape: Shape, dtype: str) -> dict[str, int]:
        """``a`` (m x k), ``b`` (k x n) and ``out`` (m x n)."""
        m, n, k, size = shape["m"], shape["n"], shape["k"], element_size(dtype)
        return {"a": m * k * size, "b": k * n * size, "out": m * n * size}

    def workspace_bytes(self, shape: Shape, dtype: str) -> dict[str, int]:
        """The reference's float32 result (m x n), its float32 copies of ``a``, ``b`` (low precision)."""
        m, n, k = shape["m"], shape["n"], shape["k"]
        return {**float32_copies(dtype, a=m * k, b=k * n), "reference": m * n * FLOAT32_BYTES}


SPEC = MatmulSpec()
