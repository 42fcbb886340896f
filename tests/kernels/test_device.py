"""Devices: chip identity, limits, clear errors for absent accelerators."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch

from tiletune.client import chip as client_chip
from tiletune.client.chip import software_fingerprint
from tiletune.kernels.device import ascend_limits, available_kinds, cpu_chip, get_device
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


def test_software_fingerprint_reads_versions_without_importing() -> None:
    """Metadata versions equal the imported modules' (local tag included, e.g. ``+cpu``)."""
    assert software_fingerprint()["torch"] == str(torch.__version__)
    assert software_fingerprint() is not software_fingerprint()  # a fresh dict each call


def test_workers_and_clients_name_the_chip_alike() -> None:
    """kernels.device builds names and fingerprints through tiletune.client.chip: equal by construction."""
    assert cpu_chip().name == client_chip.cpu_chip_name() == client_chip.detect_chip("cpu")
    assert get_device("auto").chip.name == client_chip.detect_chip("auto")  # torch is imported here
    assert software_fingerprint() == client_chip.software_fingerprint()


def test_a_torch_free_process_computes_the_same_chip_and_fingerprint() -> None:
    """What a runtime client computes without torch equals what a worker registers with torch."""
    code = (
        "import json, sys; from tiletune.client import chip; "
        "print(json.dumps({'cpu': chip.cpu_chip_name(), 'auto': chip.detect_chip(), "
        "'software': chip.software_fingerprint(), 'torch': 'torch' in sys.modules}))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    seen = json.loads(result.stdout)
    assert seen["torch"] is False
    assert seen["cpu"] == cpu_chip().name
    assert seen["software"] == software_fingerprint()
    if available_kinds() == ["cpu"]:
        assert seen["auto"] == get_device("auto").chip.name
