"""Devices: chip identity, limits, clear errors for absent accelerators."""

from __future__ import annotations

import re

import pytest
import torch

from tiletune.kernels.device import ascend_limits, available_kinds, cpu_chip, get_device, software_fingerprint
from tiletune.kernels.errors import DeviceUnavailableError, InputError


def test_cpu_chip_names_model_features_and_cores() -> None:
    chip = cpu_chip()
    assert chip.kind == "cpu"
    assert re.fullmatch(r"cpu/[^/]+/\d+c", chip.name), chip.name
    assert chip.limits.local_memory_bytes >= 64 * 1024


def test_cpu_device_times_a_call_in_milliseconds() -> None:
    device = get_device("cpu")
    assert device.torch_device == torch.device("cpu")
    elapsed = device.time_ms(lambda: sum(range(100_000)))
    assert 0 < elapsed < 1_000


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_absent_cuda_is_a_clear_error() -> None:
    with pytest.raises(DeviceUnavailableError, match=r"^cuda: no CUDA device"):
        get_device("cuda")


def test_absent_npu_is_a_clear_error_not_a_traceback() -> None:
    if "npu" in available_kinds():
        pytest.skip("an NPU is present")
    with pytest.raises(DeviceUnavailableError, match=r"^npu: torch_npu"):
        get_device("npu")


def test_auto_falls_back_to_cpu_and_unknown_kind_names_the_field() -> None:
    if available_kinds() == ["cpu"]:
        assert get_device("auto").kind == "cpu"
    with pytest.raises(InputError) as error:
        get_device("tpu")
    assert error.value.field == "backend"
    assert "cpu, cuda, npu, auto" in str(error.value)


@pytest.mark.parametrize(
    ("soc", "ub_bytes", "buffers"),
    [("Ascend910B2", 192 * 1024, 8), ("Ascend910B3", 192 * 1024, 8), ("Ascend310P3", 256 * 1024, 4)],
)
def test_ascend_unified_buffer_table(soc: str, ub_bytes: int, buffers: int) -> None:
    limits = ascend_limits(soc)
    assert limits.local_memory_bytes == ub_bytes
    assert limits.max_buffer_num == buffers
    assert limits.alignment_bytes == 32


def test_software_fingerprint_names_torch() -> None:
    fingerprint = software_fingerprint()
    assert fingerprint["torch"] == torch.__version__
    assert set(fingerprint) >= {"torch", "triton", "torch_npu"}
