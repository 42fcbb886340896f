"""What the native CPU kernels share: the ``block_dim`` knob, constraints, device support, dispatch.

A native kernel (``native_add``, ``native_softmax``, ``native_rms_norm``, ``native_matmul``,
``native_fused_attention``) is its own registered kernel, like the Triton ones: it subclasses
the portable PyTorch spec, reusing its dims, tile knobs, working set, default rule, input
maker, reference, flop and byte counts and ``shape_of``, and adds one knob:

- ``block_dim``: the cores the tiles are spread over (Ascend C's block dim), 1 … all the
  chip's cores (``DeviceLimits.cores``, which workers report; where not known, the cores
  torch's thread pool has here); more cores than tiles is invalid (idle cores).

Its implementation is C++ in ``kernels/csrc`` (see ``native.h`` there for how a core runs
its tiles: ``buffer_num`` local slots per queue, copy-in → compute → copy-out, copy-ins issued
``pipeline_depth - 1`` tiles ahead as prefetches), built by :mod:`~tiletune.kernels.native_build`
and never compiled on import. The default config is the portable rule's plus
``block_dim = min(cores, tiles)``.

The portable kernels offer the same C++ as their ``native`` implementation (listed by their
``backends()`` where the extension is built here), running their configs with that
default ``block_dim``; :func:`preferred_backend` is how a CPU run picks it over ``torch``.
"""

from __future__ import annotations

import importlib
from abc import abstractmethod
from collections.abc import Sequence
from types import ModuleType
from typing import ClassVar

import torch

from tiletune.client.space import Knob, pow2_up_to, snap_down
from tiletune.kernels.errors import DeviceUnavailableError
from tiletune.kernels.native_build import native_module, native_status
from tiletune.kernels.pipeline import require_backend
from tiletune.kernels.spec import Config, DeviceLimits, KernelSpec, Shape

NATIVE_BACKEND = "native"
PORTABLE_BACKEND = "torch"


def all_cores() -> int:
    """Cores the native kernels may spread over: the size of torch's intra-op thread pool."""
    return max(1, torch.get_num_threads())


#: Declared ``up_to`` the chip's cores: on a chip whose limits report them, 1, 2, 4, … its cores;
#: where they are not known (a worker that does not report them, a local run without limits), the
#: cores torch's thread pool has here.
BLOCK_DIM = Knob(
    "block_dim",
    pow2_up_to(all_cores()),
    "cores the tiles are spread over (Ascend C's block dim); each core runs its tiles' pipeline",
    up_to="cores",
)


def cores_of(limits: DeviceLimits | None) -> int:
    """The cores a native kernel spreads over on a chip of ``limits``: theirs, else :func:`all_cores`."""
    return limits.cores if limits is not None and limits.cores is not None else all_cores()


def native_backends() -> tuple[str, ...]:
    """The implementations of a portable kernel here: ``torch``, and ``native`` where it is built."""
    return (PORTABLE_BACKEND, NATIVE_BACKEND) if native_status().available else (PORTABLE_BACKEND,)


def preferred_backend(spec: KernelSpec, device_kind: str) -> str:
    """The implementation a run on ``device_kind`` uses when none is named.

    ``native`` on CPUs where the kernel has it (and it is built here), else the kernel's first.
    """
    backends = spec.backends()
    if device_kind == "cpu" and NATIVE_BACKEND in backends:
        return NATIVE_BACKEND
    return backends[0]


def native_twin(kernel: str) -> NativeSpec:
    """The native kernel of the portable kernel called ``kernel`` (``add`` → ``native_add``)."""
    spec = importlib.import_module(f"tiletune.kernels.native_{kernel}").SPEC
    if not isinstance(spec, NativeSpec):
        raise TypeError(f"tiletune.kernels.native_{kernel}.SPEC is not a NativeSpec")
    return spec


def run_native(kernel: str, inputs: Sequence[torch.Tensor], config: Config, shape: Shape) -> torch.Tensor:
    """A portable kernel's ``native`` implementation: its config on the native twin (default cores)."""
    return native_twin(kernel).run(inputs, config, shape, NATIVE_BACKEND)


def with_block_dim(knobs: Sequence[Knob]) -> tuple[Knob, ...]:
    """A portable kernel's knobs with :data:`BLOCK_DIM` inserted before ``buffer_num``."""
    names = [k.name for k in knobs]
    at = names.index("buffer_num") if "buffer_num" in names else len(knobs)
    return (*knobs[:at], BLOCK_DIM, *knobs[at:])


class NativeSpec(KernelSpec):
    """Base of the native kernels: put it first among the bases, before the portable spec.

    Subclasses give ``portable`` (the portable spec class they implement), ``knobs`` (its
    knobs :func:`with_block_dim`), ``tile_count`` and ``launch``.
    """

    portable: ClassVar[type[KernelSpec]]

    def backends(self) -> tuple[str, ...]:
        """Only ``"native"``: the portable implementation is the kernel without the prefix."""
        return (NATIVE_BACKEND,)

    def supports(self, device_kind: str) -> bool:
        """CPUs only, and only where the extension is built and loads (see :func:`unavailable_reason`)."""
        return device_kind == "cpu" and native_status().available

    def unavailable_reason(self) -> str | None:
        """Why the native backend cannot run here, or None when it can."""
        status = native_status()
        return None if status.available else status.reason

    @abstractmethod
    def tile_count(self, config: Config, shape: Shape) -> int:
        """How many tiles the work is cut into (what ``block_dim`` cores share)."""

    @abstractmethod
    def launch(
        self, module: ModuleType, inputs: Sequence[torch.Tensor], config: Config, shape: Shape
    ) -> torch.Tensor:
        """Call the extension on contiguous CPU ``inputs`` with a complete config."""

    def invalid_reason(self, config: Config, shape: Shape, dtype: str, limits: DeviceLimits) -> str | None:
        """More cores than tiles is invalid (they would idle); then the portable rules."""
        block_dim, tiles = config.get("block_dim", 1), self.tile_count(config, shape)
        if block_dim > tiles:
            return f"block_dim={block_dim} exceeds the {tiles} tile(s) of this config: cores would idle"
        return super().invalid_reason(config, shape, dtype, limits)

    def default_config(self, shape: Shape, dtype: str, limits: DeviceLimits) -> Config:
        """The portable rule's config, its tiles spread over ``min(cores, tiles)`` cores."""
        config = self.portable.default_config(self, shape, dtype, limits)
        return self._with_block_dim(config, shape, cores_of(limits))

    def _with_block_dim(self, config: Config, shape: Shape, cores: int) -> Config:
        """``config`` with ``block_dim``: the most of a chip of ``cores`` cores' values the tiles use."""
        block_dim = snap_down(min(cores, self.tile_count(config, shape)), pow2_up_to(cores))
        merged = {**config, "block_dim": block_dim}
        return {knob.name: merged[knob.name] for knob in self.knobs}

    def run(
        self, inputs: Sequence[torch.Tensor], config: Config, shape: Shape, backend: str = NATIVE_BACKEND
    ) -> torch.Tensor:
        """Run the C++ kernel; a config without ``block_dim`` (a portable one) gets the default cores.

        Raises :class:`DeviceUnavailableError` (with the reason) when the extension is not
        built here, and ``ValueError`` for tensors that are not on the CPU.
        """
        require_backend(self.backends(), backend)
        for tensor in inputs:
            if not tensor.is_cpu:
                raise ValueError(f"{self.name}: native kernels run on CPU tensors, got {tensor.device}")
        if "block_dim" not in config:
            config = self._with_block_dim(config, shape, all_cores())
        try:
            module = native_module()
        except DeviceUnavailableError as error:
            raise DeviceUnavailableError(f"{self.name}: {error}") from None
        return self.launch(module, [t.contiguous() for t in inputs], config, shape)
