"""Published peaks of known chips: found by registered name, per dtype; unknown chips and CPUs none."""

from __future__ import annotations

import re

import pytest

from tiletune.client.chip import cuda_chip_name, npu_chip_name
from tiletune.kernels.peaks import PEAKS, Peak, chip_peaks, model_of, peak_fraction, peak_of


class Props:
    """What ``cuda_chip_name`` reads of a GPU's properties."""

    def __init__(self, name: str, major: int, minor: int) -> None:
        self.name, self.major, self.minor = name, major, minor


@pytest.mark.parametrize(
    ("torch_name", "sm", "fp32_tflops", "fp16_tflops", "memory_gb_s"),
    [
        ("NVIDIA H200", (9, 0), 67.0, 989.5, 4800.0),
        ("NVIDIA H200 NVL", (9, 0), 60.0, 835.5, 4800.0),
        ("NVIDIA H100 80GB HBM3", (9, 0), 67.0, 989.5, 3350.0),
        ("NVIDIA H100 PCIe", (9, 0), 51.0, 756.5, 2000.0),
        ("NVIDIA H100 NVL", (9, 0), 60.0, 835.5, 3900.0),
        ("NVIDIA A100-SXM4-80GB", (8, 0), 19.5, 312.0, 2039.0),
        ("NVIDIA A100 80GB PCIe", (8, 0), 19.5, 312.0, 1935.0),
        ("NVIDIA A100-SXM4-40GB", (8, 0), 19.5, 312.0, 1555.0),
        ("NVIDIA A100-PCIE-40GB", (8, 0), 19.5, 312.0, 1555.0),
    ],
)
def test_a_gpu_is_found_by_its_registered_name_with_its_datasheet_figures(
    torch_name: str, sm: tuple[int, int], fp32_tflops: float, fp16_tflops: float, memory_gb_s: float
) -> None:
    name = cuda_chip_name(Props(torch_name, *sm))
    assert peak_of(name, "float32") == Peak(fp32_tflops * 1e12, memory_gb_s * 1e9)
    assert peak_of(name, "float16") == Peak(fp16_tflops * 1e12, memory_gb_s * 1e9)
    assert peak_of(name, "bfloat16") == peak_of(name, "float16")
    assert peak_of(torch_name, "float16") == peak_of(name, "float16")  # a bare model name too


def test_the_more_specific_part_wins_over_its_family() -> None:
    h200 = peak_of("cuda/NVIDIA H200/sm_90", "float16")
    nvl = peak_of("cuda/NVIDIA H200 NVL/sm_90", "float16")
    assert h200 is not None
    assert nvl is not None
    assert (nvl.flops_per_s or 0) < (h200.flops_per_s or 0)


def test_unknown_chips_cpus_and_unlisted_npus_have_no_peak() -> None:
    assert peak_of("cpu/AMD EPYC 9654 (AVX-512)/96c", "float32") is None
    assert peak_of("cpu/NVIDIA H200/2c", "float32") is None  # a CPU is a CPU whatever it is called
    assert peak_of("cuda/NVIDIA GeForce RTX 3090/sm_86", "float32") is None
    assert peak_of("cuda/NVIDIA H2000/sm_90", "float32") is None  # the whole model must match
    assert peak_of("replay/recorded", "float32") is None
    assert peak_of(npu_chip_name("Ascend910B2"), "float16") is None


def test_the_ascend_910_has_only_its_published_fp16_rate() -> None:
    assert peak_of(npu_chip_name("Ascend910A"), "float16") == Peak(256e12, None)
    assert peak_of(npu_chip_name("Ascend910A"), "float32") is None


def test_model_of_reads_the_model_part_of_a_registered_name() -> None:
    assert model_of("cuda/NVIDIA H200/sm_90") == "NVIDIA H200"
    assert model_of("npu/Ascend910B2") == "Ascend910B2"
    assert model_of("NVIDIA H100 PCIe") == "NVIDIA H100 PCIe"


def test_every_row_names_its_source_and_compiles() -> None:
    for row in PEAKS:
        assert row.source
        re.compile(row.pattern)
        assert row.tflops or row.memory_gb_s
    assert chip_peaks("cuda/NVIDIA H200/sm_90") is not None


def test_the_fraction_is_that_of_the_resource_that_binds() -> None:
    peak = Peak(100e12, 4e12)
    # a memory-bound kernel: few flops, bandwidth near its peak
    assert peak_fraction(peak, 1e12, 3e12) == pytest.approx(0.75)
    # a compute-bound one
    assert peak_fraction(peak, 50e12, 1e12) == pytest.approx(0.5)
    # only the figures known on both sides count
    assert peak_fraction(Peak(None, 4e12), 50e12, 1e12) == pytest.approx(0.25)
    assert peak_fraction(peak, None, None) is None
    assert peak_fraction(peak, 0.0, None) is None
    assert peak_fraction(None, 1e12, 1e12) is None
