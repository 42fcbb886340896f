"""Chip identity and software fingerprint, computed without importing torch.

A worker registers the chip it measures on under a name such as
``cpu/Intel Xeon (AVX-512, AMX)/2c``, ``cuda/NVIDIA H200/sm_90`` or
``npu/Ascend910B2``, with the versions of the software the numbers depend on.
A runtime client must ask for configs under the *same* name, on nodes where
importing torch only to name the chip would be a cost (or impossible). This
module is the one place both sides build those names: ``tiletune.kernels.device``
uses these functions, so a worker's and a client's names and fingerprints are
equal by construction.

- :func:`cpu_chip_name`: the host CPU from ``/proc/cpuinfo`` (model, ISA
  features, usable cores);
- :func:`cuda_chip_name` / :func:`npu_chip_name`: the accelerator names from
  what torch reports (used by ``kernels.device``, and by :func:`detect_chip`);
- :func:`detect_chip`: the chip this process launches kernels on. It never
  imports torch: an accelerator is seen only when the caller has already
  imported torch (and, for an NPU, torch_npu);
- :func:`software_fingerprint`: torch, triton, torch_npu versions from the
  installed distributions' metadata, CANN from the environment, Python.

Standard library only.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import sys
from functools import cache
from pathlib import Path
from typing import Protocol

CHIP_KINDS = ("cpu", "cuda", "npu")
#: The environment variable CANN's ``set_env.sh`` exports with the toolkit version.
CANN_VERSION_ENV = "ASCEND_TOOLKIT_VERSION"
#: The distributions whose versions a measurement depends on (the fingerprint's keys, with cann, python).
FINGERPRINT_PACKAGES = ("torch", "triton", "torch_npu")


class ChipUnavailableError(RuntimeError):
    """The chip kind asked for cannot be named in this process (absent, or torch not imported)."""


class CudaProperties(Protocol):
    """What :func:`cuda_chip_name` reads of ``torch.cuda.get_device_properties(index)``."""

    @property
    def name(self) -> str:
        """Marketing name, e.g. ``NVIDIA H200``."""

    @property
    def major(self) -> int:
        """Compute capability, major."""

    @property
    def minor(self) -> int:
        """Compute capability, minor."""


def _cpu_model_and_flags() -> tuple[str, set[str]]:
    model, flags = platform.processor() or platform.machine(), set[str]()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and model in ("", platform.machine(), platform.processor()):
                model = value.strip()
            elif key in ("flags", "Features") and not flags:
                flags = set(value.split())
    model = re.sub(r"\((R|TM)\)|CPU @.*|\s\d+-Core Processor|Processor", "", model)
    return " ".join(model.split()) or platform.machine(), flags


def _cpu_features(flags: set[str]) -> list[str]:
    named = [("avx512f", "AVX-512"), ("amx_tile", "AMX"), ("sve", "SVE")]
    features = [label for flag, label in named if flag in flags]
    if not features:
        features = [label for flag, label in [("avx2", "AVX2"), ("asimd", "NEON")] if flag in flags]
    return features


def _usable_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


@cache
def cpu_chip_name() -> str:
    """This host's CPU: ``cpu/<model> (<ISA features>)/<cores>c`` (cores this process may use)."""
    model, flags = _cpu_model_and_flags()
    features = _cpu_features(flags)
    label = f"{model} ({', '.join(features)})" if features else model
    return f"cpu/{label}/{_usable_cores()}c"


def cuda_chip_name(props: CudaProperties) -> str:
    """``cuda/<name>/sm_<major><minor>`` from a GPU's properties."""
    return f"cuda/{props.name}/sm_{props.major}{props.minor}"


def npu_chip_name(soc_name: str) -> str:
    """``npu/<SoC name>``, e.g. ``npu/Ascend910B2``."""
    return f"npu/{soc_name}"


def _loaded_torch() -> object | None:
    """torch, only when the caller has imported it already."""
    return sys.modules.get("torch")


def _npu_name(index: int) -> str | None:
    torch = _loaded_torch()
    if torch is None or "torch_npu" not in sys.modules:
        return None
    npu = getattr(torch, "npu", None)
    try:
        if npu is None or not npu.is_available():
            return None
        return npu_chip_name(str(npu.get_device_name(index)))
    except Exception:  # a broken runtime is "no NPU here", never a failure to name the chip
        return None


def _cuda_name(index: int) -> str | None:
    torch = _loaded_torch()
    cuda = getattr(torch, "cuda", None) if torch is not None else None
    try:
        if cuda is None or not cuda.is_available():
            return None
        props = cuda.get_device_properties(index)
        return cuda_chip_name(props)
    except Exception:  # as above: an unusable runtime means no GPU
        return None


def detect_chip(kind: str = "auto") -> str:
    """The name of the chip this process runs kernels on, as workers register it.

    ``auto``: the NPU if torch_npu is already imported and an NPU is visible,
    else the GPU if torch is already imported and CUDA is available, else the
    CPU. ``cpu``, ``cuda`` and ``npu`` ask for that kind; an accelerator that
    cannot be named (torch or torch_npu not imported by the caller, or no such
    device) raises :class:`ChipUnavailableError` saying why. torch is never
    imported here: a client that has not loaded it runs on the CPU.
    """
    if kind == "cpu":
        return cpu_chip_name()
    if kind == "npu":
        name = _npu_name(0)
        if name is None:
            raise ChipUnavailableError(
                "npu: no NPU seen; import torch and torch_npu before naming the chip "
                "(tiletune.client never imports them itself)"
            )
        return name
    if kind == "cuda":
        name = _cuda_name(0)
        if name is None:
            raise ChipUnavailableError(
                "cuda: no CUDA device seen; import torch before naming the chip "
                "(tiletune.client never imports it itself)"
            )
        return name
    if kind == "auto":
        return _npu_name(0) or _cuda_name(0) or cpu_chip_name()
    raise ValueError(f"unknown chip kind {kind!r}; choose one of {', '.join((*CHIP_KINDS, 'auto'))}")


def package_version(distribution: str) -> str | None:
    """The installed version of ``distribution`` from its metadata (never importing it), or None."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


@cache
def _fingerprint() -> tuple[tuple[str, str | None], ...]:
    versions = [(package, package_version(package)) for package in FINGERPRINT_PACKAGES]
    return (*versions, ("cann", os.environ.get(CANN_VERSION_ENV)), ("python", platform.python_version()))


def software_fingerprint() -> dict[str, str | None]:
    """Versions a measurement depends on, stored beside the chip: torch, triton, torch_npu, cann, python.

    Package versions come from the installed distributions' metadata, so no
    package is imported (for the torch wheels this equals ``torch.__version__``,
    local tag included, e.g. ``2.13.0+cpu``). Computed once per process; each
    call returns a fresh dict.
    """
    return dict(_fingerprint())
