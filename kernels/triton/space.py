"""What the Triton kernels' declarations share: their launch knobs and constraints (torch-free).

A Triton kernel (``triton_add``, ``triton_softmax``, ``triton_rms_norm``, ``triton_matmul``,
``triton_fused_attention``) declares the dims, inputs and counts of its portable kernel and its
own knobs:

- block sizes (the tile knobs, declared with :func:`block_knob`): powers of two, as
  ``tl.arange`` needs. For a shape they are clamped to the smallest power of two that covers their
  dim (but never below the knob's smallest value: 16 where ``tl.dot`` needs it) and deduplicated,
  so "the whole dim in one block" is always a candidate and the kernels mask the blocks' overhang;
- ``num_stages`` (1..4): Triton's software-pipelining depth, which is also the buffer count: the
  loads of up to ``num_stages - 1`` later iterations of the kernel's main loop are in flight, each
  in its own buffer of shared memory;
- ``num_warps`` (1, 2, 4, 8): warps of 32 threads per program on CUDA.

On Ascend NPUs (triton-ascend) the knob space is the same, but there are no warps and buffering
is ``multibuffer`` (off/on): a chip whose limits say ``kind == "npu"`` rejects ``num_warps != 1``
and ``num_stages > 2``.

Constraints (``invalid_reason``): the working set (each kernel documents it; the blocks in flight
times ``num_stages``) must fit ``limits.local_memory_bytes`` (shared memory per block on CUDA, the
unified buffer on Ascend); ``num_stages > 1`` needs a main loop of more than one step to pipeline.
"""

from __future__ import annotations

from abc import abstractmethod

from tiletune.client.space import CLAMP_POW2_CEIL, DeviceLimits, Knob
from tiletune.kernels.declaration import Config, HeuristicTiling, KernelDeclaration, Shape

#: The implementation's name: the ``@triton.jit`` kernels.
TRITON_BACKEND = "triton"
#: Triton's own default warps per program: the default config's ``num_warps`` off an NPU.
DEFAULT_NUM_WARPS = 4
#: On Ascend: ``num_stages`` 1 or 2 = ``multibuffer`` off or on.
NPU_MAX_STAGES = 2

NUM_STAGES = Knob(
    "num_stages",
    (1, 2, 3, 4),
    "software-pipelining depth = buffer count: loads of the next num_stages-1 iterations of the main "
    "loop are in flight, each in its own shared-memory buffer (Ascend: 1/2 = multibuffer off/on)",
)
NUM_WARPS = Knob(
    "num_warps",
    (1, 2, 4, 8),
    "warps of 32 threads per program (CUDA); Ascend has no warps, so only 1 is valid there",
)


def block_knob(name: str, values: tuple[int, ...], doc: str, clamp_to: str) -> Knob:
    """A block knob: for a shape, its values clamped to the smallest power of two covering
    ``clamp_to`` (never below its smallest value), the declared rule ``pow2_ceil``."""
    return Knob(name, values, doc, clamp_to=clamp_to, clamp=CLAMP_POW2_CEIL)


class TritonDeclaration(KernelDeclaration):
    """Base of the Triton kernels' declarations: put it first among the bases, before the
    portable kernel's declaration.

    Subclasses give ``knobs`` (their block knobs, then :data:`NUM_STAGES` and
    :data:`NUM_WARPS`), ``working_set_bytes``, ``loop_steps`` and ``default_config``
    (through :meth:`launch_defaults`).
    """

    implementations: tuple[str, ...] = (TRITON_BACKEND,)

    @abstractmethod
    def loop_steps(self, config: Config, shape: Shape) -> int:
        """Iterations of the main loop (the one ``num_stages`` pipelines) in the longest program."""

    def invalid_reason(self, config: Config, shape: Shape, dtype: str, limits: DeviceLimits) -> str | None:
        """NPU knob rules, something to pipeline, and the working set within local memory."""
        stages, warps = config["num_stages"], config["num_warps"]
        if limits.kind == "npu":
            if warps != 1:
                return f"num_warps={warps}: Ascend NPUs have no warps (triton-ascend ignores it); use 1"
            if stages > NPU_MAX_STAGES:
                return f"num_stages={stages}: on Ascend it is multibuffer, off (1) or on (2)"
        if stages > 1 and self.loop_steps(config, shape) == 1:
            return f"num_stages={stages}: the blocks cover the problem in one loop step, nothing to pipeline"
        needed = self.working_set_bytes(config, shape, dtype)
        if needed > limits.local_memory_bytes:
            return (
                f"working set {needed} B (blocks in flight x num_stages={stages}) exceeds local memory "
                f"{limits.local_memory_bytes} B ({_local_memory_name(limits.kind)})"
            )
        return super().invalid_reason(config, shape, dtype, limits)

    def launch_defaults(self, rule: HeuristicTiling, steps: int, limits: DeviceLimits) -> Config:
        """``num_stages`` and ``num_warps`` of the default config, from the hand-written rule.

        ``num_stages`` is the rule's pipeline depth (Triton's stages are its buffers:
        each stage in flight has one), 1 when the main loop has a single step, and
        at most 2 on an NPU (multibuffer); ``num_warps`` is Triton's default, 4 (the
        rule has no such knob), and 1 on an NPU.
        """
        npu = limits.kind == "npu"
        stages = 1 if steps == 1 else rule.pipeline_depth
        return {
            "num_stages": min(stages, NPU_MAX_STAGES) if npu else stages,
            "num_warps": 1 if npu else DEFAULT_NUM_WARPS,
        }


def _local_memory_name(kind: str) -> str:
    return {"cuda": "shared memory per block", "npu": "unified buffer per AI core"}.get(kind, "L2 per core")
