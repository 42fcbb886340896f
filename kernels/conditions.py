"""Measurement conditions: what the machine was doing while a config was timed, and the defaults
that keep accelerator timings honest.

A time means little without the state it was taken in. Each measurement carries a
:class:`MeasurementConditions`, read before and after its timed runs (:func:`measured_at_clock`):

- on every host: the CPU frequency governor (``/sys/devices/system/cpu/cpu*/cpufreq/
  scaling_governor`` of the CPUs this process may run on; ``None`` where the kernel exposes no
  cpufreq, as in many containers), the load average (``os.getloadavg``: 1 and 5 minutes) and the
  mean clock of those CPUs from ``/proc/cpuinfo`` (``cpu MHz``; ``None`` where it is not listed);
- on CUDA and NPU besides: the device's clock, its rated maximum and its temperature
  (:mod:`.device_clock`: NVML, npu-smi).

Readers never raise: a missing tool, library, file or field leaves its fields ``None``.

The clock check (:func:`measured_at_clock`): ``clock_fraction = clock_mhz / max_clock_mhz``, of
the lower of the readings before and after. A measurement taken below :data:`MIN_CLOCK_FRACTION`
of the rated clock (a device still ramping up from idle, or throttled) is taken again, the one
just taken serving as warm-up, up to :data:`MAX_CLOCK_REPEATS` times; the last is kept with
``low_clock`` set when its clock was still low. The CPU has no rated clock to compare against
(turbo runs above the nominal one): its clock is recorded, never checked.

The cache flush (:func:`default_flush_bytes`): on CUDA and NPU the harness writes
:data:`ACCELERATOR_FLUSH_BYTES` (256 MiB, the buffer Triton's ``do_bench`` clears; larger than an
H200's 50-60 MB or a 910B's 192 MB of L2) before each timed run, so no run finds the previous
one's data in L2. On CPUs the default is no flush.

Imports the standard library, :mod:`.device` and :mod:`.device_clock`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from tiletune.kernels.device import Device
from tiletune.kernels.device_clock import ClockReading, NpuSmiReader, NvmlReader, bounded_number

#: Below this fraction of its rated clock a device's measurement is taken again. Power-capped
#: boost under load stays above it; a device ramping up from an idle clock, or throttled hard
#: for heat, is below it.
MIN_CLOCK_FRACTION = 0.8
#: How many times a low-clock measurement is taken again before it is kept, flagged ``low_clock``.
MAX_CLOCK_REPEATS = 2
#: Bytes written before each timed run on accelerators (Triton's ``do_bench`` clears 256 MiB).
ACCELERATOR_FLUSH_BYTES = 256 * 1024 * 1024
#: Where Linux lists the CPUs (``cpu0/cpufreq/scaling_governor``, ...).
SYSFS_CPU_ROOT = Path("/sys/devices/system/cpu")
PROC_CPUINFO = Path("/proc/cpuinfo")

T = TypeVar("T")


def default_flush_bytes(kind: str) -> int:
    """Bytes to flush before each timed run on a device of ``kind`` (see the module docstring)."""
    return ACCELERATOR_FLUSH_BYTES if kind in ("cuda", "npu") else 0


@dataclass(frozen=True)
class MeasurementConditions:
    """The state of the machine around one measurement (see the module docstring).

    ``clock_repeats``: how many times the measurement was taken again for a low clock;
    ``low_clock``: it was still below :data:`MIN_CLOCK_FRACTION` after the last repeat.
    """

    device_kind: str
    governor: str | None = None
    load_1m: float | None = None
    load_5m: float | None = None
    cpu_mhz: float | None = None
    clock_mhz: float | None = None
    max_clock_mhz: float | None = None
    temperature_c: float | None = None
    clock_repeats: int = 0
    low_clock: bool = False

    @property
    def clock_fraction(self) -> float | None:
        """``clock_mhz / max_clock_mhz``, or None when either is unknown."""
        if self.clock_mhz is None or not self.max_clock_mhz:
            return None
        return self.clock_mhz / self.max_clock_mhz

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready fields, ``clock_fraction`` included."""
        return {**dataclasses.asdict(self), "clock_fraction": self.clock_fraction}


# -- the host: governor, load, clock ----------------------------------------------------------------


def _cpu_dirs(cpu_root: Path, cpus: Iterable[int] | None) -> list[Path]:
    if cpus is not None:
        return [cpu_root / f"cpu{cpu}" for cpu in sorted(set(cpus))]
    found = [path for path in cpu_root.glob("cpu*") if re.fullmatch(r"cpu\d+", path.name)]
    return sorted(found, key=lambda path: int(path.name[3:]))


def read_governor(cpu_root: Path = SYSFS_CPU_ROOT, cpus: Iterable[int] | None = None) -> str | None:
    """The frequency governor of ``cpus`` (default: every CPU under ``cpu_root``).

    One name (``performance``) when they agree, the distinct names sorted and joined by commas
    when they do not (``performance,powersave``), None when no CPU exposes one.
    """
    names: set[str] = set()
    for cpu_dir in _cpu_dirs(cpu_root, cpus):
        try:
            name = (cpu_dir / "cpufreq" / "scaling_governor").read_text().strip()
        except (OSError, UnicodeDecodeError):
            continue
        if re.fullmatch(r"[A-Za-z0-9_.-]{1,32}", name):
            names.add(name)
    return ",".join(sorted(names)) if names else None


def parse_cpuinfo_mhz(text: str, cpus: Iterable[int] | None = None) -> float | None:
    """The mean ``cpu MHz`` of ``cpus`` (default: all) in ``/proc/cpuinfo`` text; None when absent."""
    wanted = None if cpus is None else set(cpus)
    processor: int | None = None
    values: list[float] = []
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "processor":
            processor = int(value) if value.strip().isdigit() else None
        elif key == "cpu MHz" and (wanted is None or processor in wanted):
            mhz = bounded_number(value.strip(), 1.0, 1e5)
            if mhz is not None:
                values.append(mhz)
    return sum(values) / len(values) if values else None


def read_load() -> tuple[float | None, float | None]:
    """The 1- and 5-minute load averages (None where the platform has none)."""
    try:
        load_1m, load_5m, _ = os.getloadavg()
    except OSError:
        return None, None
    return bounded_number(load_1m, 0.0, 1e6), bounded_number(load_5m, 0.0, 1e6)


def _allowed_cpus() -> set[int] | None:
    getter = getattr(os, "sched_getaffinity", None)
    try:
        return set(getter(0)) if getter is not None else None
    except OSError:
        return None


def host_conditions(
    device_kind: str, cpu_root: Path = SYSFS_CPU_ROOT, cpuinfo: Path = PROC_CPUINFO
) -> MeasurementConditions:
    """Governor, load and CPU clock of the CPUs this process may run on (never raises)."""
    cpus = _allowed_cpus()
    try:
        cpu_mhz = parse_cpuinfo_mhz(cpuinfo.read_text(errors="replace"), cpus)
    except OSError:
        cpu_mhz = None
    load_1m, load_5m = read_load()
    return MeasurementConditions(
        device_kind=device_kind,
        governor=read_governor(cpu_root, cpus),
        load_1m=load_1m,
        load_5m=load_5m,
        cpu_mhz=cpu_mhz,
    )


# -- readers per device, and the clock check ---------------------------------------------------------

ConditionsReader = Callable[[], MeasurementConditions]


def conditions_reader(device: Device) -> ConditionsReader | None:
    """What reads ``device``'s conditions: the host's alone on a CPU, the host's and the device's
    clocks on CUDA and NPU; None for a device that times nothing (replay)."""
    kind = device.kind
    if kind not in ("cpu", "cuda", "npu"):
        return None
    if kind == "cpu":
        return lambda: host_conditions("cpu")
    index = device.torch_device.index or 0
    clocks: Callable[[], ClockReading] = NvmlReader(index) if kind == "cuda" else NpuSmiReader(index)

    def read() -> MeasurementConditions:
        return dataclasses.replace(host_conditions(kind), **dataclasses.asdict(clocks()))

    return read


def combined(before: MeasurementConditions, after: MeasurementConditions) -> MeasurementConditions:
    """One record of two readings around a measurement: the lower clock (with its maximum), the
    higher temperature, the later host readings (the earlier where the later has none)."""
    slower = before if _fraction_key(before) < _fraction_key(after) else after
    temperatures = [t for t in (before.temperature_c, after.temperature_c) if t is not None]
    return dataclasses.replace(
        after,
        governor=after.governor if after.governor is not None else before.governor,
        load_1m=after.load_1m if after.load_1m is not None else before.load_1m,
        load_5m=after.load_5m if after.load_5m is not None else before.load_5m,
        cpu_mhz=after.cpu_mhz if after.cpu_mhz is not None else before.cpu_mhz,
        clock_mhz=slower.clock_mhz,
        max_clock_mhz=slower.max_clock_mhz,
        temperature_c=max(temperatures) if temperatures else None,
    )


def _fraction_key(conditions: MeasurementConditions) -> float:
    fraction = conditions.clock_fraction
    return math.inf if fraction is None else fraction


def measured_at_clock(
    take: Callable[[], T],
    read: ConditionsReader,
    min_fraction: float = MIN_CLOCK_FRACTION,
    max_repeats: int = MAX_CLOCK_REPEATS,
) -> tuple[T, MeasurementConditions]:
    """``take()`` a measurement between two readings; again while the clock was low.

    A measurement whose ``clock_fraction`` (:func:`combined` readings) is under ``min_fraction``
    is taken again, up to ``max_repeats`` times (the previous one warmed the device up); the
    last is returned with ``low_clock`` set if its clock was still low. An unknown clock is not
    low. ``take``'s exceptions propagate; the readers raise none.
    """
    repeats = 0
    while True:
        before = read()
        result = take()
        conditions = combined(before, read())
        fraction = conditions.clock_fraction
        low = fraction is not None and fraction < min_fraction
        if not low or repeats >= max_repeats:
            return result, dataclasses.replace(conditions, clock_repeats=repeats, low_clock=low)
        repeats += 1
