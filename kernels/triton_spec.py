"""What the Triton kernels share: their launch knobs, constraints, device support and launch options.

A Triton kernel (``triton_add``, ``triton_softmax``, ``triton_rms_norm``,
``triton_matmul``, ``triton_fused_attention``) is its own registered kernel: it
subclasses the portable PyTorch spec, reusing its dims, input maker, reference,
flop and byte counts and ``shape_of``, and declares its own knobs:

- block sizes (the tile knobs, declared with :func:`block_knob`): powers of two, as
  ``tl.arange`` needs. For a shape they are clamped to the smallest power of two that covers their dim
  (but never below the knob's smallest value: 16 where ``tl.dot`` needs it) and
  deduplicated, so "the whole dim in one block" is always a candidate and the
  kernels mask the blocks' overhang (shapes the blocks do not divide);
- ``num_stages`` (1..4): Triton's software-pipelining depth, which is also the
  buffer count: the loads of up to ``num_stages - 1`` later iterations of the
  kernel's main loop are in flight, each in its own buffer of shared memory;
- ``num_warps`` (1, 2, 4, 8): warps of 32 threads per program on CUDA.

On Ascend NPUs (triton-ascend) the knob space is the same, but there are no
warps and buffering is ``multibuffer`` (off/on): a chip whose limits say
``kind == "npu"`` rejects ``num_warps != 1`` and ``num_stages > 2``, and
:meth:`TritonSpec.launch_options` maps ``num_stages`` 1/2 to ``multibuffer``
False/True.

Constraints (``invalid_reason``): the working set (each kernel documents it;
the blocks in flight times ``num_stages``) must fit ``limits.local_memory_bytes``
(shared memory per block on CUDA, the unified buffer on Ascend); ``num_stages >
1`` needs a main loop of more than one step to pipeline. A config that passes
and still fails to compile or runs out of resources raises from ``run``; the
bench turns that into a failed trial with its reason.

Triton itself is imported only by :mod:`tiletune.kernels.triton_kernels`, on the
first run: these specs import, list and constrain without triton installed.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from abc import abstractmethod
from collections.abc import Sequence
from types import ModuleType

import torch

from tiletune.client.space import CLAMP_POW2_CEIL, Knob
from tiletune.kernels.errors import DeviceUnavailableError
from tiletune.kernels.pipeline import require_backend
from tiletune.kernels.spec import Config, DeviceLimits, HeuristicTiling, KernelSpec, Shape

TRITON_BACKEND = "triton"
INTERPRET_ENV = "TRITON_INTERPRET"
#: Distribution names under which triton-ascend installs its ``triton`` package.
ASCEND_DISTRIBUTIONS = ("triton-ascend", "triton_ascend")
INSTALL_HINT = "install tiletune[triton] (triton-ascend on Ascend NPUs)"
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


def triton_installed() -> bool:
    """True when ``triton`` can be found (not imported: that is left to the first run)."""
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):
        return False


def triton_ascend_installed() -> bool:
    """True when triton-ascend (Triton with the Ascend backend) is installed."""
    for name in ASCEND_DISTRIBUTIONS:
        try:
            importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        return triton_installed()
    return False


def interpreting() -> bool:
    """True when Triton runs kernels in its interpreter (``TRITON_INTERPRET=1``): CPU tensors."""
    return os.environ.get(INTERPRET_ENV, "").strip().lower() in {"1", "true", "on"}


def triton_kernels() -> ModuleType:
    """The module of ``@triton.jit`` kernels, imported (and triton with it) on first use.

    Raises :class:`DeviceUnavailableError` with the reason when triton cannot load.
    """
    try:
        from tiletune.kernels import triton_kernels as module
    except ImportError as error:
        raise DeviceUnavailableError(f"triton: cannot load ({error}); {INSTALL_HINT}") from None
    return module


class TritonSpec(KernelSpec):
    """Base of the Triton kernels: put it first among the bases, before the portable spec.

    Subclasses give ``knobs`` (their block knobs, then :data:`NUM_STAGES` and
    :data:`NUM_WARPS`), ``working_set_bytes``, ``loop_steps``, ``default_config``
    (through :meth:`launch_defaults`) and ``run`` (through :meth:`prepare_launch`).
    """

    def backends(self) -> tuple[str, ...]:
        """Only ``"triton"``: the portable implementation is the kernel without the prefix."""
        return (TRITON_BACKEND,)

    def supports(self, device_kind: str) -> bool:
        """cuda: when triton is installed; cpu: only in Triton's interpreter; npu: with triton-ascend."""
        if device_kind == "cuda":
            return triton_installed()
        if device_kind == "cpu":
            return interpreting() and triton_installed()
        if device_kind == "npu":
            return triton_ascend_installed()
        return False

    def launch_options(self, config: Config, device_kind: str) -> dict[str, object]:
        """Triton launch keywords for ``config`` on ``device_kind``.

        cuda and the cpu interpreter: ``num_warps`` and ``num_stages``; npu
        (triton-ascend): ``multibuffer`` (``num_stages > 1``), with no warps.
        """
        if device_kind == "npu":
            return {"multibuffer": config["num_stages"] > 1}
        return {"num_warps": config["num_warps"], "num_stages": config["num_stages"]}

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

    def prepare_launch(
        self, inputs: Sequence[torch.Tensor], config: Config, backend: str
    ) -> tuple[ModuleType, dict[str, object]]:
        """The kernels module and launch options for a run on ``inputs``' device.

        Raises (and the bench records the reason) when the backend is not
        ``triton`` or Triton cannot run on that device here.
        """
        require_backend(self.backends(), backend)
        kind = inputs[0].device.type
        if not triton_installed():
            raise DeviceUnavailableError(f"{self.name}: triton is not installed; {INSTALL_HINT}")
        if kind == "cpu" and not interpreting():
            raise DeviceUnavailableError(
                f"{self.name}: Triton runs on CPU tensors only in its interpreter; "
                f"set {INTERPRET_ENV}=1 before the first run"
            )
        if kind == "npu" and not self.supports(kind):
            raise DeviceUnavailableError(f"{self.name}: Triton on Ascend NPUs needs triton-ascend installed")
        if not self.supports(kind):
            raise DeviceUnavailableError(f"{self.name}: Triton cannot run on {kind} tensors")
        module = triton_kernels()
        if kind == "cpu" and not module.INTERPRETED:
            raise DeviceUnavailableError(
                f"{self.name}: the Triton kernels were loaded before {INTERPRET_ENV}=1 was set; "
                "set it before the first run"
            )
        return module, self.launch_options(config, kind)


def _local_memory_name(kind: str) -> str:
    return {"cuda": "shared memory per block", "npu": "unified buffer per AI core"}.get(kind, "L2 per core")
