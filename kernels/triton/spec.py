"""What the Triton kernels' specs share: device support, launch options, loading triton.

Their declarations (knobs, constraints, default rule) are :mod:`tiletune.kernels.triton.space`.
On Ascend NPUs :meth:`TritonSpec.launch_options` maps ``num_stages`` 1/2 to ``multibuffer``
False/True. A config that passes the declaration's constraints and still fails to compile or runs
out of resources raises from ``run``; the bench turns that into a failed trial with its reason.

Triton itself is imported only by :mod:`tiletune.kernels.triton.jit`, on the first run: these
specs import, list and constrain without triton installed.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
from collections.abc import Sequence
from types import ModuleType

import torch

from tiletune.kernels.declaration import Config
from tiletune.kernels.errors import DeviceUnavailableError
from tiletune.kernels.pipeline import require_backend
from tiletune.kernels.spec import KernelSpec
from tiletune.kernels.triton.space import TRITON_BACKEND, TritonDeclaration

INTERPRET_ENV = "TRITON_INTERPRET"
#: Distribution names under which triton-ascend installs its ``triton`` package.
ASCEND_DISTRIBUTIONS = ("triton-ascend", "triton_ascend")
INSTALL_HINT = "install tiletune[triton] (triton-ascend on Ascend NPUs)"


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


def triton_kernels(module: str = "jit") -> ModuleType:
    """The module ``tiletune.kernels.triton.<module>`` of ``@triton.jit`` kernels (``jit``: the
    forwards'; a backward kernel has a module of its own), imported (and triton with it) on first use.
    Such a module records in ``INTERPRETED`` whether triton loaded in its interpreter.

    Raises :class:`DeviceUnavailableError` with the reason when triton cannot load.
    """
    try:
        return importlib.import_module(f"tiletune.kernels.triton.{module}")
    except ImportError as error:
        raise DeviceUnavailableError(f"triton: cannot load ({error}); {INSTALL_HINT}") from None


class TritonSpec(TritonDeclaration, KernelSpec):
    """Base of the Triton kernels' specs. A Triton kernel's spec lists its Triton declaration,
    then this class, then its portable spec (whose inputs, reference and ``shape_of`` it reuses):
    ``class TritonAddSpec(TritonAddDeclaration, TritonSpec, AddSpec)``.

    Subclasses give ``run`` (through :meth:`prepare_launch`).
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

    def prepare_launch(
        self, inputs: Sequence[torch.Tensor], config: Config, backend: str, module: str = "jit"
    ) -> tuple[ModuleType, dict[str, object]]:
        """The kernels module (``tiletune.kernels.triton.<module>``) and launch options for a run on
        ``inputs``' device.

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
        kernels = triton_kernels(module)
        if kind == "cpu" and not kernels.INTERPRETED:
            raise DeviceUnavailableError(
                f"{self.name}: the Triton kernels were loaded before {INTERPRET_ENV}=1 was set; "
                "set it before the first run"
            )
        return kernels, self.launch_options(config, kind)
