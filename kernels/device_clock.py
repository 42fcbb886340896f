"""Accelerator clocks and temperature, read from the drivers' tools: NVML on CUDA, npu-smi on Ascend.

- CUDA: the SM clock, its maximum and the GPU temperature from NVML (the ``nvidia-ml-py``
  package, ``import pynvml``, imported on first use): ``nvmlDeviceGetClockInfo`` and
  ``nvmlDeviceGetMaxClockInfo`` with ``NVML_CLOCK_SM``, ``nvmlDeviceGetTemperature`` with
  ``NVML_TEMPERATURE_GPU``. The device is found by its UUID, else its PCI bus id, else its index
  when ``CUDA_VISIBLE_DEVICES`` does not renumber the GPUs (:func:`nvml_handle_keys`).
- Ascend: the AI Core's current and rated clock (``Aicore curFreq(MHZ)``, ``Aicore Freq(MHZ)``)
  and the chip's temperature (``Temperature(C)``) from ``npu-smi info -t common -i <NPU ID>``;
  torch's device index is a chip logic id (through ``ASCEND_RT_VISIBLE_DEVICES`` when that
  renumbers the devices), mapped to the NPU ID and chip of ``npu-smi info -m``.

Readers never raise: a missing tool, library or field leaves its fields ``None``. The parsers take
the tools' output (text, or raw values) as input, so they are tested without the hardware.
Imports the standard library, and torch for a CUDA device's identity (when a reader is made).
"""

from __future__ import annotations

import importlib
import math
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

#: Seconds ``npu-smi`` may take to answer before a reading gives up (fields ``None``).
TOOL_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class ClockReading:
    """A device's clock (MHz), its rated maximum (MHz) and its temperature (°C), each when known."""

    clock_mhz: float | None = None
    max_clock_mhz: float | None = None
    temperature_c: float | None = None


def bounded_number(value: object, low: float, high: float) -> float | None:
    """``value`` as a finite float within [low, high], else None."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and low <= number <= high else None


def clock_reading(clock_mhz: object, max_clock_mhz: object, temperature_c: object) -> ClockReading:
    """A reading from raw values (NVML's unsigned ints, npu-smi's text): a clock of 0 or less, or
    anything that is not a number, is unknown (None); temperatures outside -50..200 °C too."""
    return ClockReading(
        clock_mhz=bounded_number(clock_mhz, 1.0, 1e5),
        max_clock_mhz=bounded_number(max_clock_mhz, 1.0, 1e5),
        temperature_c=bounded_number(temperature_c, -50.0, 200.0),
    )


# -- CUDA: NVML -------------------------------------------------------------------------------------


@cache
def _nvml() -> Any:
    """The initialised ``pynvml`` module, or None when it or the driver's library is missing."""
    try:
        nvml = importlib.import_module("pynvml")
        nvml.nvmlInit()
    except Exception:  # ImportError, NVMLError (no driver, no permission): no clocks, no failure
        return None
    return nvml


def nvml_handle_keys(
    uuid: str | None, pci_bus_id: str | None, index: int, visible_devices: str | None
) -> list[tuple[str, str | int]]:
    """How to find a torch CUDA device in NVML, best first: ``(NVML function, argument)`` pairs.

    By UUID (NVML spells it ``GPU-…``; torch without the prefix), by PCI bus id, and by index only
    when ``CUDA_VISIBLE_DEVICES`` (``visible_devices``) is unset: NVML numbers every GPU of the
    host, torch only the visible ones.
    """
    keys: list[tuple[str, str | int]] = []
    if uuid:
        keys.append(
            ("nvmlDeviceGetHandleByUUID", uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")
        )
    if pci_bus_id:
        keys.append(("nvmlDeviceGetHandleByPciBusId", pci_bus_id))
    if visible_devices is None:
        keys.append(("nvmlDeviceGetHandleByIndex", index))
    return keys


def _cuda_identity(index: int) -> tuple[str | None, str | None]:
    """The UUID and PCI bus id (``0000:1B:00.0``) torch reports for CUDA device ``index``."""
    try:
        import torch

        props = torch.cuda.get_device_properties(index)
    except Exception:
        return None, None
    uuid = getattr(props, "uuid", None)
    domain, bus, device = (getattr(props, f"pci_{name}_id", None) for name in ("domain", "bus", "device"))
    pci = f"{domain:08X}:{bus:02X}:{device:02X}.0" if None not in (domain, bus, device) else None
    return (str(uuid) if uuid is not None else None), pci


class NvmlReader:
    """Reads CUDA device ``index``'s SM clock, its maximum and its temperature through NVML.

    ``handle_source`` names the NVML function that found the device (None: not found, every
    reading empty).
    """

    def __init__(self, index: int) -> None:
        self._handle: Any = None
        self.handle_source: str | None = None
        nvml = _nvml()
        if nvml is None:
            return
        uuid, pci = _cuda_identity(index)
        for function, argument in nvml_handle_keys(uuid, pci, index, os.environ.get("CUDA_VISIBLE_DEVICES")):
            handle = _quietly(getattr(nvml, function, None), argument)
            if handle is not None:
                self._handle, self.handle_source = handle, function
                return

    def __call__(self) -> ClockReading:
        """The reading now (fields None where NVML does not answer)."""
        nvml = _nvml()
        if nvml is None or self._handle is None:
            return ClockReading()
        return clock_reading(
            _quietly(nvml.nvmlDeviceGetClockInfo, self._handle, nvml.NVML_CLOCK_SM),
            _quietly(nvml.nvmlDeviceGetMaxClockInfo, self._handle, nvml.NVML_CLOCK_SM),
            _quietly(nvml.nvmlDeviceGetTemperature, self._handle, nvml.NVML_TEMPERATURE_GPU),
        )


def _quietly(function: Callable[..., Any] | None, *args: Any) -> Any:
    """``function(*args)``, or None when it is missing or raises."""
    if function is None:
        return None
    try:
        return function(*args)
    except Exception:
        return None


# -- Ascend: npu-smi --------------------------------------------------------------------------------


def parse_npu_smi_mapping(text: str) -> dict[int, tuple[int, int]]:
    """``npu-smi info -m`` text -> {chip logic id: (NPU ID, chip id)}.

    Rows are ``NPU ID  Chip ID  Chip Logic ID  [Chip Phy-ID]  Chip Name``; rows whose logic id is
    not a number (``-``: the card's MCU) and the header are left out.
    """
    mapping: dict[int, tuple[int, int]] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 3 and all(field.isdigit() for field in fields[:3]):
            mapping[int(fields[2])] = (int(fields[0]), int(fields[1]))
    return mapping


def parse_npu_smi_common(text: str, chip_id: int = 0) -> ClockReading:
    """The reading of chip ``chip_id`` in ``npu-smi info -t common -i <NPU ID>`` text.

    ``key : value`` lines; ``Chip ID : N`` starts chip N's section and ``Chip Name : mcu`` the
    card's MCU's (its temperature is not the chip's). Output without ``Chip ID`` lines (one chip
    per card) holds the chip's fields at the top. ``Aicore curFreq(MHZ)`` is the current clock,
    ``Aicore Freq(MHZ)`` the rated one, ``Temperature(C)`` the first temperature of the section.
    """
    sections: dict[object, dict[str, str]] = {}
    section: object = None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip(), value.strip()
        if key == "Chip ID":
            section = int(value) if value.isdigit() else "unknown"
            continue
        if key == "Chip Name":
            section = f"named {value}"
            continue
        sections.setdefault(section, {}).setdefault(key, value)
    fields = sections.get(chip_id) or sections.get(None) or {}
    return clock_reading(
        fields.get("Aicore curFreq(MHZ)"), fields.get("Aicore Freq(MHZ)"), fields.get("Temperature(C)")
    )


def visible_logic_id(index: int, visible_devices: str | None) -> int | None:
    """The chip logic id of torch NPU ``index`` under ``ASCEND_RT_VISIBLE_DEVICES`` (None: unset)."""
    if not visible_devices:
        return index
    listed = [part.strip() for part in visible_devices.split(",")]
    if index >= len(listed) or not listed[index].isdigit():
        return None
    return int(listed[index])


def run_tool(args: list[str], timeout_s: float = TOOL_TIMEOUT_S) -> str | None:
    """A command's standard output, or None when it is missing, fails or takes over ``timeout_s``."""
    if shutil.which(args[0]) is None:
        return None
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


class NpuSmiReader:
    """Reads NPU ``index``'s AI Core clock, rated clock and temperature through ``npu-smi``.

    The NPU ID and chip come from ``npu-smi info -m`` once; when that lists nothing, the chip
    logic id is taken as the NPU ID with chip 0 (one chip per card, as on the 910B). ``run``
    runs a command and returns its output or None (:func:`run_tool`).
    """

    def __init__(self, index: int, run: Callable[[list[str]], str | None] = run_tool) -> None:
        self._run = run
        logic = visible_logic_id(index, os.environ.get("ASCEND_RT_VISIBLE_DEVICES"))
        mapping = parse_npu_smi_mapping(run(["npu-smi", "info", "-m"]) or "")
        self.target = None if logic is None else mapping.get(logic, (logic, 0) if not mapping else None)

    def __call__(self) -> ClockReading:
        """The reading now (fields None where npu-smi does not answer)."""
        if self.target is None:
            return ClockReading()
        npu_id, chip_id = self.target
        text = self._run(["npu-smi", "info", "-t", "common", "-i", str(npu_id)])
        return parse_npu_smi_common(text, chip_id) if text else ClockReading()
