"""What the native CPU kernels' specs share: device support, dispatch to the extension, the CPU's preference.

Their declarations (``block_dim``, the constraint, the default rule) are
:mod:`tiletune.kernels.native.space`. The implementation is C++ in ``kernels/native/csrc`` (see
``native.h`` there for how a core runs its tiles: ``buffer_num`` local slots per queue, copy-in →
compute → copy-out, copy-ins issued ``pipeline_depth - 1`` tiles ahead as prefetches), built by
:mod:`~tiletune.kernels.native.build` and never compiled on import.

The portable kernels offer the same C++ as their ``native`` implementation (listed by their
``backends()`` where the extension is built here), running their configs with ``block_dim`` for
all of torch's threads here; :func:`preferred_backend` is how a CPU run picks it over ``torch``.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from types import ModuleType

import torch

from tiletune.kernels.declaration import PORTABLE_BACKEND, Config, Shape
from tiletune.kernels.errors import DeviceUnavailableError
from tiletune.kernels.family import family_of
from tiletune.kernels.native.build import native_module, native_status
from tiletune.kernels.native.space import NATIVE_BACKEND, NativeDeclaration, in_preference
from tiletune.kernels.pipeline import require_backend
from tiletune.kernels.registry import get_kernel
from tiletune.kernels.spec import KernelSpec


def all_cores() -> int:
    """Cores the native kernels may spread over here: the size of torch's intra-op thread pool
    (what a CPU device's limits report, :func:`tiletune.kernels.device.cpu_chip`)."""
    return max(1, torch.get_num_threads())


def native_backends() -> tuple[str, ...]:
    """The implementations of a portable kernel here: ``torch``, and ``native`` where it is built."""
    return (PORTABLE_BACKEND, NATIVE_BACKEND) if native_status().available else (PORTABLE_BACKEND,)


def preferred_backend(spec: KernelSpec, device_kind: str) -> str:
    """The implementation a run on ``device_kind`` uses when none is named.

    ``native`` on CPUs where the kernel has it (and it is built here), else the kernel's first.
    """
    return in_preference(spec.backends(), device_kind)[0]


def native_twin(kernel: str) -> NativeSpec:
    """The native kernel of the portable kernel called ``kernel``: its family's ``native``
    implementation (``add`` → ``native_add``)."""
    family = family_of(kernel)
    native = None if family is None else family.implementation(NATIVE_BACKEND)
    if native is None:
        raise TypeError(f"kernel {kernel!r} has no native implementation")
    spec = get_kernel(native.kernel)
    if not isinstance(spec, NativeSpec):
        raise TypeError(f"{native.spec} is not a NativeSpec")
    return spec


def run_native(kernel: str, inputs: Sequence[torch.Tensor], config: Config, shape: Shape) -> torch.Tensor:
    """A portable kernel's ``native`` implementation: its config on the native twin (default cores)."""
    return native_twin(kernel).run(inputs, config, shape, NATIVE_BACKEND)


class NativeSpec(NativeDeclaration, KernelSpec):
    """Base of the native kernels' specs. A native kernel's spec lists its native declaration,
    then this class, then its portable spec (whose inputs, reference and ``shape_of`` it reuses):
    ``class NativeAddSpec(NativeAddDeclaration, NativeSpec, AddSpec)``.

    Subclasses give ``launch``. ``keeps_layout``: the kernel takes its inputs' strides as they come
    (its ``launch`` handles the layouts it reads in place); otherwise ``run`` makes them contiguous.
    """

    keeps_layout: bool = False

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
    def launch(
        self, module: ModuleType, inputs: Sequence[torch.Tensor], config: Config, shape: Shape
    ) -> torch.Tensor:
        """Call the extension on CPU ``inputs`` (contiguous, unless ``keeps_layout``), complete config."""

    def run(
        self, inputs: Sequence[torch.Tensor], config: Config, shape: Shape, backend: str = NATIVE_BACKEND
    ) -> torch.Tensor:
        """Run the C++ kernel; a config without ``block_dim`` (a portable one) gets the default cores.

        Raises :class:`DeviceUnavailableError` (with the reason) when the extension is not
        built here, and ``ValueError`` for tensors that are not on the CPU.
        """
        module, config = self.prepare(inputs, config, shape, backend)
        tensors = list(inputs) if self.keeps_layout else [t.contiguous() for t in inputs]
        return self.launch(module, tensors, config, shape)

    def prepare(
        self, inputs: Sequence[torch.Tensor], config: Config, shape: Shape, backend: str
    ) -> tuple[ModuleType, Config]:
        """What a launch needs checked first: the backend, CPU tensors, the extension (returned);
        and the config, completed with the default ``block_dim`` where it has none."""
        require_backend(self.backends(), backend)
        for tensor in inputs:
            if not tensor.is_cpu:
                raise ValueError(f"{self.name}: native kernels run on CPU tensors, got {tensor.device}")
        if "block_dim" not in config:
            config = self.with_cores(config, shape, all_cores())
        try:
            return native_module(), config
        except DeviceUnavailableError as error:
            raise DeviceUnavailableError(f"{self.name}: {error}") from None
