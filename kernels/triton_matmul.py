"""``triton_matmul``: ``C[m, n] = A[m, k] @ B[k, n]`` in Triton, accumulated in float32.

Dims, inputs, reference and counts are ``matmul``'s. A program computes one
``block_m x block_n`` output tile (programs in groups of 8 tile rows, for L2
reuse of A), looping over ``k`` in ``block_k`` steps with ``tl.dot``; the loop
is pipelined by ``num_stages``. float32 inputs use full-precision dots (TF32
would miss the float32 tolerance); float16/bfloat16 use the tensor cores.

Working set (shared memory on CUDA): the A and B blocks of every stage,
``(block_m * block_k + block_k * block_n) * element size * num_stages``.
Block values start at 16, which ``tl.dot`` needs.

Default (the hand-written rule, ``total = m * n``): ``heuristic_tiling`` gives
tile elements ``E``; ``block_m``, ``block_n`` and ``block_k`` all take the square
side ``pow2_floor(sqrt(E))``, snapped down to their knob values (16 at least);
for ``total <= 1024`` every block covers its dim (``block_k`` at most 128).
``num_stages`` = the rule's depth (1 when one k step covers ``k``),
``num_warps`` = 4 (see :meth:`TritonSpec.launch_defaults`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from tiletune.client.space import snap_down
from tiletune.kernels.matmul import MatmulSpec
from tiletune.kernels.spec import Config, DeviceLimits, Shape, element_size, heuristic_tiling, pow2_floor
from tiletune.kernels.triton_spec import NUM_STAGES, NUM_WARPS, TritonSpec, block_knob

BLOCK_MN = tuple(1 << p for p in range(4, 9))
BLOCK_K = tuple(1 << p for p in range(4, 8))


class TritonMatmulSpec(TritonSpec, MatmulSpec):
    """GEMM in Triton: one output tile per program, a pipelined k loop of ``tl.dot``."""

    name = "triton_matmul"
    version = 1
    description = "matmul in Triton: block_m x block_n output tiles, pipelined k loop of tl.dot"
    knobs = (
        block_knob("block_m", BLOCK_MN, "rows of an output tile (a power of two, >= 16)", clamp_to="m"),
        block_knob("block_n", BLOCK_MN, "columns of an output tile (a power of two, >= 16)", clamp_to="n"),
        block_knob("block_k", BLOCK_K, "depth of one k step (a power of two, >= 16)", clamp_to="k"),
        NUM_STAGES,
        NUM_WARPS,
    )

    def working_set_bytes(self, config: Config, shape: Shape, dtype: str) -> int:
        """The A and B blocks of every stage in flight."""
        bm, bn, bk = config["block_m"], config["block_n"], config["block_k"]
        return (bm * bk + bk * bn) * element_size(dtype) * config["num_stages"]

    def loop_steps(self, config: Config, shape: Shape) -> int:
        """k steps per output tile."""
        return -(-shape["k"] // config["block_k"])

    def default_config(self, shape: Shape, dtype: str, limits: DeviceLimits) -> Config:
        """Square blocks of the rule's tile elements (whole dims for tiny problems)."""
        rule = heuristic_tiling(shape["m"] * shape["n"], element_size(dtype), limits.local_memory_bytes)
        values = self.knob_values(shape)
        small = shape["m"] * shape["n"] <= 1024  # the rule's "one tile of everything"
        side = pow2_floor(math.sqrt(rule.tile_elements))
        blocks = {
            knob: values[knob][-1] if small else snap_down(side, values[knob])
            for knob in ("block_m", "block_n", "block_k")
        }
        return {**blocks, **self.launch_defaults(rule, self.loop_steps(blocks, shape), limits)}

    def run(
        self, inputs: Sequence[torch.Tensor], config: Config, shape: Shape, backend: str = "triton"
    ) -> torch.Tensor:
        """``A @ B`` by the Triton kernel."""
        kernels, options = self.prepare_launch(inputs, config, backend)
        a, b = (t.contiguous() for t in inputs)
        c = torch.empty((shape["m"], shape["n"]), dtype=a.dtype, device=a.device)
        kernels.matmul(a, b, c, (config["block_m"], config["block_n"], config["block_k"]), options)
        return c


SPEC = TritonMatmulSpec()
