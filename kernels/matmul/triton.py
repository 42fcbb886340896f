"""``triton_matmul``: ``C[m, n] = A[m, k] @ B[k, n]`` in Triton, accumulated in float32.

Its declaration (knobs, working set, default) is
:class:`~tiletune.kernels.matmul.declaration.TritonMatmulDeclaration`;
inputs and reference are ``matmul``'s. A program computes one
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

Layouts: the kernel reads A and B through their strides, so a transposed operand
(``a_transposed`` / ``b_transposed``) is loaded in place, block by block.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.matmul.declaration import TritonMatmulDeclaration
from tiletune.kernels.matmul.portable import MatmulSpec, layout
from tiletune.kernels.triton.spec import TritonSpec


class TritonMatmulSpec(TritonMatmulDeclaration, TritonSpec, MatmulSpec):
    """GEMM in Triton: one output tile per program, a pipelined k loop of ``tl.dot``."""

    def run(
        self, inputs: Sequence[torch.Tensor], config: Config, shape: Shape, backend: str = "triton"
    ) -> torch.Tensor:
        """``A @ B`` by the Triton kernel, which reads the operands through their strides: a
        transposed one in place, others as :func:`layout` gives them."""
        kernels, options = self.prepare_launch(inputs, config, backend)
        (a, _), (b, _) = (layout(t) for t in inputs)
        c = torch.empty((shape["m"], shape["n"]), dtype=a.dtype, device=a.device)
        kernels.matmul(a, b, c, (config["block_m"], config["block_n"], config["block_k"]), options)
        return c


SPEC = TritonMatmulSpec()
