"""Devices: what a kernel runs on, its identity and limits, and how it is timed.

A :class:`Device` gives the chip's identity (``chip.name``, e.g.
``cpu/AMD EPYC (AVX-512)/2c``, ``cuda/NVIDIA H200/sm_90``, ``npu/Ascend910B2``),
the limits constraints use (:class:`DeviceLimits`), the torch device inputs live
on, and a timer: ``time.perf_counter_ns`` on CPUs, device events with
synchronisation on accelerators. CUDA goes through torch; the NPU through
torch_npu, imported only when an NPU is asked for, so its absence is a clear
:class:`DeviceUnavailableError`, never an import-time traceback.

Chip names and the software fingerprint are built by :mod:`tiletune.client.chip`
(standard library only), so the names workers register and the names runtime
clients look configs up under are equal by construction.

The ``replay`` kind (:class:`ReplayDevice`) is no hardware: one chip, :data:`REPLAY_CHIP`,
on which replay kernels (:mod:`tiletune.kernels.replay.spec`) are "measured" by looking
their recorded times up (:class:`~tiletune.tuner.measure.replay_bench.ReplayBench`); it times
nothing. ``auto`` never picks it.
"""

from __future__ import annotations

import importlib
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from tiletune.client.chip import cpu_chip_name, cuda_chip_name, npu_chip_name
from tiletune.client.wire import DEVICE_KINDS
from tiletune.kernels.errors import DeviceUnavailableError, InputError
from tiletune.kernels.native.spec import all_cores
from tiletune.kernels.replay.declaration import REPLAY_KIND
from tiletune.kernels.spec import DeviceLimits

__all__ = [
    "ASCEND_UB_BYTES",
    "DEVICE_KINDS",
    "REPLAY_CHIP",
    "AcceleratorDevice",
    "Chip",
    "CpuDevice",
    "Device",
    "ReplayDevice",
    "ascend_limits",
    "available_kinds",
    "cpu_chip",
    "get_device",
]

#: Unified buffer per AI core and queue-buffer limit by Ascend SoC family (published
#: figures); read at run time where the platform reports it, this table otherwise.
ASCEND_UB_BYTES: dict[str, tuple[int, int]] = {
    "Ascend910B": (192 * 1024, 8),
    "Ascend910_93": (192 * 1024, 8),
    "Ascend910": (256 * 1024, 4),
    "Ascend310P": (256 * 1024, 4),
    "Ascend310B": (256 * 1024, 4),
}
DEFAULT_CPU_L2_BYTES = 1024 * 1024
DEFAULT_GPU_SMEM_BYTES = 48 * 1024


@dataclass(frozen=True)
class Chip:
    """A chip's identity (``kind/model/detail``) and the limits its constraints use."""

    kind: str
    name: str
    limits: DeviceLimits


class Device(ABC):
    """Where kernels run and how their time is taken."""

    chip: Chip
    torch_device: torch.device

    @property
    def kind(self) -> str:
        """``cpu``, ``cuda``, ``npu`` or ``replay``."""
        return self.chip.kind

    @abstractmethod
    def synchronize(self) -> None:
        """Wait until all work queued on the device has finished."""

    @abstractmethod
    def time_ms(self, fn: Callable[[], object]) -> float:
        """Run ``fn`` once and return its time in milliseconds, measured on the device."""


class CpuDevice(Device):
    """The host CPU; local memory is the L2 cache of one core."""

    def __init__(self) -> None:
        self.chip = cpu_chip()
        self.torch_device = torch.device("cpu")

    def synchronize(self) -> None:
        """Nothing to wait for: CPU kernels are synchronous."""

    def time_ms(self, fn: Callable[[], object]) -> float:
        """Wall time of one call from ``perf_counter_ns``, nothing else in between."""
        start = time.perf_counter_ns()
        fn()
        return (time.perf_counter_ns() - start) / 1e6


class AcceleratorDevice(Device):
    """A CUDA GPU or an Ascend NPU, timed with device events."""

    def __init__(self, chip: Chip, torch_device: torch.device, module: object) -> None:
        self.chip = chip
        self.torch_device = torch_device
        self._module = module  # torch.cuda or torch.npu

    def synchronize(self) -> None:
        """Block until the device's queued work is done."""
        self._module.synchronize()  # type: ignore[attr-defined]

    def time_ms(self, fn: Callable[[], object]) -> float:
        """Time of one call between two recorded device events."""
        event = self._module.Event  # type: ignore[attr-defined]
        start, end = event(enable_timing=True), event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end))


class ReplayDevice(Device):
    """The replay "chip": recorded times are its measurements, so there is nothing to time.

    Every replay worker registers :data:`REPLAY_CHIP` (one chip for all recordings, so any
    replay worker may lease any replay job). ``trial_ms`` is a simulated duration per
    measured config (:meth:`occupy`; 0: none), so benchmarks can model trials of, say,
    100 ms; a negative or non-finite one is an :class:`InputError` naming
    ``replay_trial_ms``.
    """

    def __init__(self, trial_ms: float = 0.0) -> None:
        if not math.isfinite(trial_ms) or trial_ms < 0:
            raise InputError("replay_trial_ms", f"must be a number of ms >= 0, got {trial_ms!r}")
        self.chip = REPLAY_CHIP
        self.torch_device = torch.device("cpu")  # never used: replay kernels allocate nothing
        self.trial_ms = trial_ms

    def synchronize(self) -> None:
        """Nothing to wait for."""

    def time_ms(self, fn: Callable[[], object]) -> float:
        """Raises ``RuntimeError``: a replay device measures by lookup, it times nothing."""
        raise RuntimeError("a replay device times nothing: replay kernels are measured by lookup")

    def occupy(self) -> None:
        """Spend the simulated duration of one measurement (``trial_ms``)."""
        if self.trial_ms > 0:
            time.sleep(self.trial_ms / 1e3)


#: The chip of every replay device. Its limits are unused (replay kernels' validity is the
#: recording's) but the service needs some: those of a GPU's shared memory per block.
REPLAY_CHIP = Chip(
    REPLAY_KIND,
    f"{REPLAY_KIND}/recorded",
    DeviceLimits(local_memory_bytes=DEFAULT_GPU_SMEM_BYTES, kind=REPLAY_KIND),
)


def _cpu_l2_bytes() -> int:
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            if (index / "level").read_text().strip() == "2":
                size = (index / "size").read_text().strip().upper()
                scale = {"K": 1024, "M": 1024 * 1024}.get(size[-1], 1)
                return int(size.rstrip("KM")) * scale
        except (OSError, ValueError):
            continue
    return DEFAULT_CPU_L2_BYTES


@cache
def cpu_chip() -> Chip:
    """This host's CPU: ``cpu/<model> (<ISA features>)/<cores>c``, L2 per core as local memory, and
    the cores the native kernels spread over (torch's intra-op threads: what a CPU worker reports)."""
    limits = DeviceLimits(local_memory_bytes=_cpu_l2_bytes(), kind="cpu", cores=all_cores())
    return Chip("cpu", cpu_chip_name(), limits)


def _cuda_device(index: int = 0) -> AcceleratorDevice:
    if not torch.cuda.is_available():
        raise DeviceUnavailableError("cuda: no CUDA device is visible to torch")
    props = torch.cuda.get_device_properties(index)
    smem = int(getattr(props, "shared_memory_per_block_optin", 0) or DEFAULT_GPU_SMEM_BYTES)
    chip = Chip(
        "cuda",
        cuda_chip_name(props),
        DeviceLimits(local_memory_bytes=smem, max_buffer_num=8, alignment_bytes=16, kind="cuda"),
    )
    return AcceleratorDevice(chip, torch.device("cuda", index), torch.cuda)


def ascend_limits(soc_name: str) -> DeviceLimits:
    """UB size and buffers per queue for an Ascend SoC name such as ``Ascend910B2``."""
    for prefix in sorted(ASCEND_UB_BYTES, key=len, reverse=True):
        if soc_name.startswith(prefix):
            ub, buffers = ASCEND_UB_BYTES[prefix]
            return DeviceLimits(local_memory_bytes=ub, max_buffer_num=buffers, alignment_bytes=32, kind="npu")
    return DeviceLimits(local_memory_bytes=192 * 1024, max_buffer_num=4, alignment_bytes=32, kind="npu")


def _npu_device(index: int = 0) -> AcceleratorDevice:
    try:
        importlib.import_module("torch_npu")
    except ImportError as error:
        raise DeviceUnavailableError(
            f"npu: torch_npu is not installed or cannot load ({error}); install tiletune[npu] and CANN"
        ) from None
    npu = getattr(torch, "npu", None)
    if npu is None or not npu.is_available():
        raise DeviceUnavailableError("npu: torch_npu is installed but no NPU is visible")
    soc = str(npu.get_device_name(index))
    chip = Chip("npu", npu_chip_name(soc), ascend_limits(soc))
    return AcceleratorDevice(chip, torch.device("npu", index), npu)


def get_device(kind: str = "auto") -> Device:
    """The device for ``kind`` (``cpu``, ``cuda``, ``npu``, ``replay`` or ``auto``: NPU, then CUDA,
    then CPU; never replay).

    Raises :class:`DeviceUnavailableError` with the reason when ``kind`` is not here,
    and :class:`InputError` (field ``backend``) for an unknown kind.
    """
    if kind == "cpu":
        return CpuDevice()
    if kind == "cuda":
        return _cuda_device()
    if kind == "npu":
        return _npu_device()
    if kind == REPLAY_KIND:
        return ReplayDevice()
    if kind == "auto":
        for candidate in ("npu", "cuda"):
            try:
                return get_device(candidate)
            except DeviceUnavailableError:
                continue
        return CpuDevice()
    raise InputError(
        "backend",
        f"unknown device {kind!r}; choose one of {', '.join((*DEVICE_KINDS, 'auto'))} "
        f"(or {REPLAY_KIND}: recorded spaces, measured by lookup)",
    )


def available_kinds() -> list[str]:
    """Device kinds usable on this host, CPU always included."""
    kinds = ["cpu"]
    for kind in ("cuda", "npu"):
        try:
            get_device(kind)
        except DeviceUnavailableError:
            continue
        kinds.append(kind)
    return kinds
