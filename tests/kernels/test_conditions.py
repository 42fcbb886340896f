"""Measurement conditions: the host's readers on fake sysfs and real load averages, the NVML and
npu-smi parsers on the tools' recorded output, the clock check, the flush default, and conditions
attached to real CPU measurements."""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path

import pytest

from tiletune.kernels import get_kernel
from tiletune.kernels.conditions import (
    ACCELERATOR_FLUSH_BYTES,
    MAX_CLOCK_REPEATS,
    MIN_CLOCK_FRACTION,
    MeasurementConditions,
    combined,
    conditions_reader,
    default_flush_bytes,
    host_conditions,
    measured_at_clock,
    parse_cpuinfo_mhz,
    read_governor,
    read_load,
)
from tiletune.kernels.device import CpuDevice, ReplayDevice
from tiletune.kernels.device_clock import (
    NpuSmiReader,
    clock_reading,
    nvml_handle_keys,
    parse_npu_smi_common,
    parse_npu_smi_mapping,
    visible_logic_id,
)
from tiletune.tuner.measure.bench import BenchSettings, CacheFlusher, KernelBench

QUICK = BenchSettings(warmup_runs=1, min_samples=3, max_samples=5, budget_s=0.01)

#: ``npu-smi info -t common -i 1`` on a 910B card (one chip and the card's MCU).
NPU_SMI_COMMON_910B = """
        NPU ID                         : 1
        Chip Count                     : 1

        Chip ID                        : 0
        Memory Usage Rate(%)           : 0
        HBM Usage Rate(%)              : 4
        Aicore Usage Rate(%)           : 0
        Aicore Freq(MHZ)               : 1800
        Aicore curFreq(MHZ)            : 800
        Aicore Count                   : 24
        Temperature(C)                 : 46
        NPU Real-time Power(W)         : 93.4

        Chip Name                      : mcu
        Temperature(C)                 : 38
"""

#: The same command as the Ascend documentation's example prints it: no ``Chip ID`` lines.
NPU_SMI_COMMON_DOCS = """NPU ID                         : 0
Memory Usage Rate(%)           : 0
HBM Usage Rate(%)              : 3
Aicore Usage Rate(%)           : 0
Aicore Freq(MHZ)               : 1650
Aicore curFreq(MHZ)            : 100
Aicore Count                   : 32
Temperature(C)                 : 65
NPU Real-time Power(W)         : 298.6
"""

#: ``npu-smi info -m`` on a host of two 910B cards (each one chip and an MCU); columns 31 wide.
NPU_SMI_MAPPING = "".join(
    "\t" + "".join(f"{cell:<31}" for cell in row).rstrip() + "\n"
    for row in (
        ("NPU ID", "Chip ID", "Chip Logic ID", "Chip Name"),
        ("0", "0", "0", "Ascend 910B3"),
        ("0", "1", "-", "Mcu"),
        ("1", "0", "1", "Ascend 910B3"),
        ("1", "1", "-", "Mcu"),
    )
)

CPUINFO = """processor\t: 0
model name\t: Test CPU
cpu MHz\t\t: 2600.000

processor\t: 1
model name\t: Test CPU
cpu MHz\t\t: 3000.000
"""


def fake_sysfs(root: Path, governors: dict[int, str | None]) -> Path:
    """A ``/sys/devices/system/cpu`` with one ``cpuN`` per entry (None: no cpufreq for that CPU)."""
    for cpu, governor in governors.items():
        folder = root / f"cpu{cpu}"
        folder.mkdir(parents=True)
        if governor is not None:
            (folder / "cpufreq").mkdir()
            (folder / "cpufreq" / "scaling_governor").write_text(governor + "\n")
    (root / "cpufreq").mkdir(exist_ok=True)  # a sibling that is no CPU
    return root


def test_the_governor_is_read_from_sysfs_and_is_none_where_there_is_no_cpufreq(tmp_path: Path) -> None:
    assert read_governor(fake_sysfs(tmp_path / "a", {0: "performance", 1: "performance"})) == "performance"
    mixed = fake_sysfs(tmp_path / "b", {0: "powersave", 1: "performance", 2: "schedutil"})
    assert read_governor(mixed) == "performance,powersave,schedutil"
    assert read_governor(mixed, cpus=[1]) == "performance"
    assert read_governor(fake_sysfs(tmp_path / "c", {0: None, 1: None})) is None
    assert read_governor(tmp_path / "missing") is None


def test_a_governor_that_is_not_a_plain_name_is_left_out(tmp_path: Path) -> None:
    root = fake_sysfs(tmp_path, {0: "performance", 1: "bad name\x00"})
    assert read_governor(root) == "performance"


def test_the_load_average_is_the_systems() -> None:
    load_1m, load_5m = read_load()
    assert load_1m is not None
    assert load_5m is not None
    assert load_1m >= 0
    assert load_5m >= 0
    assert abs(load_1m - os.getloadavg()[0]) < 2.0  # the same reading, moments apart


def test_the_cpu_clock_is_the_mean_of_the_listed_cpus() -> None:
    assert parse_cpuinfo_mhz(CPUINFO) == pytest.approx(2800.0)
    assert parse_cpuinfo_mhz(CPUINFO, cpus=[1]) == pytest.approx(3000.0)
    assert parse_cpuinfo_mhz("processor\t: 0\nBogoMIPS\t: 50.00\n") is None  # aarch64 lists none


def test_host_conditions_record_governor_load_and_clock(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(CPUINFO)
    cpus = sorted(os.sched_getaffinity(0))
    root = fake_sysfs(tmp_path / "cpu", dict.fromkeys(cpus, "powersave"))
    conditions = host_conditions("cpu", cpu_root=root, cpuinfo=cpuinfo)
    assert conditions.device_kind == "cpu"
    assert conditions.governor == "powersave"
    assert conditions.load_1m is not None
    assert conditions.load_1m >= 0
    assert conditions.cpu_mhz is not None
    assert 2600.0 <= conditions.cpu_mhz <= 3000.0
    assert conditions.clock_fraction is None  # a CPU's clock is never checked


def test_host_conditions_without_the_files_are_none_not_an_error(tmp_path: Path) -> None:
    conditions = host_conditions("cpu", cpu_root=tmp_path / "none", cpuinfo=tmp_path / "none.txt")
    assert (conditions.governor, conditions.cpu_mhz) == (None, None)
    assert conditions.load_1m is not None


def test_npu_smi_common_gives_the_chips_clocks_and_temperature_not_the_mcus() -> None:
    reading = parse_npu_smi_common(NPU_SMI_COMMON_910B, chip_id=0)
    assert (reading.clock_mhz, reading.max_clock_mhz, reading.temperature_c) == (800.0, 1800.0, 46.0)
    documented = parse_npu_smi_common(NPU_SMI_COMMON_DOCS)
    assert (documented.clock_mhz, documented.max_clock_mhz, documented.temperature_c) == (100.0, 1650.0, 65.0)
    assert parse_npu_smi_common("dcmi model initialized failed\n") == clock_reading(None, None, None)


def test_npu_smi_mapping_maps_logic_ids_to_cards_and_chips() -> None:
    assert parse_npu_smi_mapping(NPU_SMI_MAPPING) == {0: (0, 0), 1: (1, 0)}
    assert visible_logic_id(0, None) == 0
    assert visible_logic_id(1, "4,6") == 6
    assert visible_logic_id(2, "4,6") is None


def test_the_npu_reader_runs_npu_smi_for_the_mapped_card() -> None:
    commands: list[list[str]] = []

    def run(args: list[str]) -> str | None:
        commands.append(args)
        return NPU_SMI_MAPPING if args[-1] == "-m" else NPU_SMI_COMMON_910B

    reader = NpuSmiReader(1, run=run)
    assert reader.target == (1, 0)
    assert reader().clock_mhz == 800.0
    assert commands[-1] == ["npu-smi", "info", "-t", "common", "-i", "1"]
    assert NpuSmiReader(0, run=lambda args: None)() == clock_reading(None, None, None)


def test_nvml_values_and_the_ways_to_find_a_gpu() -> None:
    reading = clock_reading(1755, 1980, 61)
    assert (reading.clock_mhz, reading.max_clock_mhz, reading.temperature_c) == (1755.0, 1980.0, 61.0)
    assert clock_reading(0, math.nan, 900) == clock_reading(None, None, None)
    keys = nvml_handle_keys("0b0c2b8e-aaaa-bbbb-cccc-0123456789ab", "00000000:1B:00.0", 0, None)
    assert keys == [
        ("nvmlDeviceGetHandleByUUID", "GPU-0b0c2b8e-aaaa-bbbb-cccc-0123456789ab"),
        ("nvmlDeviceGetHandleByPciBusId", "00000000:1B:00.0"),
        ("nvmlDeviceGetHandleByIndex", 0),
    ]
    assert nvml_handle_keys(None, None, 1, "3,1") == [], "a renumbered index names another GPU in NVML"


def test_two_readings_keep_the_lower_clock_and_the_higher_temperature() -> None:
    before = MeasurementConditions("cuda", load_1m=0.5, clock_mhz=1980, max_clock_mhz=1980, temperature_c=50)
    after = MeasurementConditions("cuda", load_1m=0.7, clock_mhz=1400, max_clock_mhz=1980, temperature_c=45)
    both = combined(before, after)
    assert (both.clock_mhz, both.temperature_c, both.load_1m) == (1400, 50, 0.7)
    assert both.clock_fraction == pytest.approx(1400 / 1980)
    assert both.as_dict()["clock_fraction"] == pytest.approx(1400 / 1980)


def _readings(*clocks_mhz: float) -> list[MeasurementConditions]:
    return [MeasurementConditions("npu", clock_mhz=mhz, max_clock_mhz=1800.0) for mhz in clocks_mhz]


def test_a_measurement_at_a_low_clock_is_taken_again_until_the_clock_is_up() -> None:
    readings = iter(_readings(800, 900, 1800, 1800))  # idle before the first, at the rated clock after
    taken: list[int] = []

    def take() -> int:
        taken.append(len(taken))
        return len(taken)

    result, conditions = measured_at_clock(take, lambda: next(readings))
    assert taken == [0, 1]
    assert result == 2
    assert (conditions.clock_repeats, conditions.low_clock, conditions.clock_mhz) == (1, False, 1800)


def test_a_clock_that_stays_low_is_kept_with_a_flag_after_the_last_repeat() -> None:
    low = 0.5 * MIN_CLOCK_FRACTION * 1800
    readings = iter(_readings(*[low] * (2 * (MAX_CLOCK_REPEATS + 1))))
    taken: list[int] = []
    _, conditions = measured_at_clock(lambda: taken.append(1), lambda: next(readings))
    assert len(taken) == MAX_CLOCK_REPEATS + 1
    assert (conditions.clock_repeats, conditions.low_clock) == (MAX_CLOCK_REPEATS, True)


def test_an_unknown_clock_is_measured_once() -> None:
    taken: list[int] = []
    _, conditions = measured_at_clock(lambda: taken.append(1), lambda: MeasurementConditions("cuda"))
    assert taken == [1]
    assert not conditions.low_clock
    assert conditions.clock_repeats == 0


def test_accelerators_flush_256_mib_by_default_and_cpus_do_not() -> None:
    assert ACCELERATOR_FLUSH_BYTES == 256 * 1024 * 1024
    assert [default_flush_bytes(kind) for kind in ("cuda", "npu", "cpu", "replay")] == [
        ACCELERATOR_FLUSH_BYTES,
        ACCELERATOR_FLUSH_BYTES,
        0,
        0,
    ]
    assert BenchSettings().flush_bytes is None  # "by device"
    device = CpuDevice()
    assert not CacheFlusher(device, None).active
    assert CacheFlusher(device, 1 << 20).active


def test_a_cpu_measurement_carries_the_hosts_conditions() -> None:
    device = CpuDevice()
    assert conditions_reader(ReplayDevice()) is None
    spec = get_kernel("add")
    bench = KernelBench(spec, {"n": 4096}, "float32", device, settings=QUICK)
    default = spec.default_config({"n": 4096}, "float32", device.chip.limits)
    result = bench.evaluate(default)
    assert result.measurement is not None
    assert result.measurement.conditions is not None
    conditions = result.measurement.conditions
    assert conditions.device_kind == "cpu"
    assert conditions.load_1m is not None
    assert conditions.governor == read_governor(cpus=os.sched_getaffinity(0))
    assert result.measurement.as_dict()["conditions"] == conditions.as_dict()
    compared = bench.compare([default, default])
    assert all(m.conditions is not None and m.conditions.device_kind == "cpu" for m in compared)
    assert dataclasses.replace(compared[0], conditions=None).as_dict().get("conditions") is None
