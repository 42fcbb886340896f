"""tiletune's kernels as PyTorch operators: ``torch.ops.tiletune.<kernel>``, one name per kernel.

Importing this package registers them (``torch.library.custom_op``, namespace ``tiletune``):

- ``add(Tensor a, Tensor b) -> Tensor``: ``a + b`` (same sizes, any number of dims);
- ``softmax(Tensor x) -> Tensor``: softmax over the last dim;
- ``rms_norm(Tensor x, Tensor weight, float eps=1e-6) -> Tensor``: ``x / sqrt(mean(x^2, -1) + eps) *
  weight`` (any ``eps``: a call argument, not part of the tuned key);
- ``matmul(Tensor a, Tensor b) -> Tensor``: ``a [m, k] @ b [k, n]``;
- ``fused_attention(Tensor q, Tensor k, Tensor v, Tensor? mask=None, *, int causal=0, float? scale=None)
  -> (Tensor out, Tensor lse)``: ``softmax(scale * q k^T + mask) v`` over ``q [batch, heads, seq_q,
  head_dim]`` and ``k``, ``v [batch, kv_heads, seq_kv, head_dim]`` (grouped-query attention), an
  additive mask ``[batch|1, heads|1, seq_q, seq_kv]``, ``causal`` 0 / 1 (top-left) / 2
  (bottom-right), and each query row's log-sum-exp (float32), which its backward recomputes from.

and the backward operators their autograd calls (:mod:`.gradients`), each running a tuned backward
kernel whose keys carry the forward's dims:

- ``softmax_backward(Tensor out, Tensor grad) -> Tensor``;
- ``rms_norm_backward(Tensor x, Tensor weight, Tensor grad, float eps=1e-6) -> (Tensor dx, Tensor
  dweight)``;
- ``fused_attention_backward(Tensor q, Tensor k, Tensor v, Tensor? mask, Tensor out, Tensor lse, Tensor
  grad, Tensor? grad_lse, *, int causal=0, float? scale=None) -> (Tensor dq, Tensor dk, Tensor dv)``;

``matmul``'s backward is two ``matmul`` calls on the transposes (``a_transposed``/``b_transposed`` keys).

A plugin kernel gets its operator with one call: :func:`~.plugins.register_operator`.

Each runs, per call, the kernel's implementation for the tensors' device (:mod:`.dispatch`: on a
CPU the native C++ where it is built, else the portable pipeline; on CUDA the Triton kernel where
triton runs) under the config the process's config source gives for the call's shape
(:mod:`.source`: ``configure()``, else the kernels' own rules), looked up when the operator runs,
never when a graph is traced. Each has a fake implementation (shapes for ``torch.compile`` and
meta tensors) and a backward (the backward operators), so models train through them and compile with no
graph break. float64 tensors run the kernel's reference formula (for gradient checks), never a
tuned config.
"""

from tiletune.kernels.ops.definitions import OPERATORS
from tiletune.kernels.ops.plugins import register_operator
from tiletune.kernels.ops.source import configure, current_source, using_source

__all__ = ["OPERATORS", "configure", "current_source", "register_operator", "using_source"]
