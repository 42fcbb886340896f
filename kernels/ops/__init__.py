"""tiletune's kernels as PyTorch operators: ``torch.ops.tiletune.<kernel>``, one name per kernel.

Importing this package registers them (``torch.library.custom_op``, namespace ``tiletune``):

- ``add(Tensor a, Tensor b) -> Tensor``: ``a + b`` (same sizes, any number of dims);
- ``softmax(Tensor x) -> Tensor``: softmax over the last dim;
- ``rms_norm(Tensor x, Tensor weight) -> Tensor``: ``x / sqrt(mean(x^2, -1) + 1e-6) * weight``;
- ``matmul(Tensor a, Tensor b) -> Tensor``: ``a [m, k] @ b [k, n]``;
- ``fused_attention(Tensor q, Tensor k, Tensor v, bool causal=False) -> Tensor``:
  ``softmax(q k^T / sqrt(head_dim) [+ causal mask]) v`` over ``[batch, heads, seq, head_dim]``.

Each runs, per call, the kernel's implementation for the tensors' device (:mod:`.dispatch`: on a
CPU the native C++ where it is built, else the portable pipeline; on CUDA the Triton kernel where
triton runs) under the config the process's config source gives for the call's shape
(:mod:`.source`: ``configure()``, else the kernels' own rules), looked up when the operator runs,
never when a graph is traced. Each has a fake implementation (shapes for ``torch.compile`` and
meta tensors) and a backward (:mod:`.backward`), so models train through them and compile with no
graph break. float64 tensors run the kernel's reference formula (for gradient checks), never a
tuned config.
"""

from tiletune.kernels.ops.definitions import OPERATORS
from tiletune.kernels.ops.source import configure, current_source, using_source

__all__ = ["OPERATORS", "configure", "current_source", "using_source"]
