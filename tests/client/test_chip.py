"""Chip names and the software fingerprint without torch (tiletune.client.chip)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from types import ModuleType, SimpleNamespace

import pytest

from tiletune.client import chip

#: Runs in a fresh interpreter: everything the module offers, then which heavy modules got loaded.
PROBE = """
import json, sys
from tiletune.client import chip
names = {"cpu": chip.cpu_chip_name(), "auto": chip.detect_chip(), "software": chip.software_fingerprint()}
try:
    chip.detect_chip("cuda")
except chip.ChipUnavailableError as error:
    names["cuda_error"] = str(error)
names["loaded"] = sorted(m for m in ("torch", "torch_npu", "triton") if m in sys.modules)
print(json.dumps(names))
"""


def test_a_fresh_interpreter_names_the_chip_without_loading_torch() -> None:
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    seen = json.loads(result.stdout)
    assert seen["loaded"] == []
    assert re.fullmatch(r"cpu/[^/]+/\d+c", seen["cpu"]), seen["cpu"]
    assert seen["auto"] == seen["cpu"]  # torch not imported: no accelerator is looked for
    assert "import torch before naming the chip" in seen["cuda_error"]
    assert set(seen["software"]) == {"torch", "triton", "torch_npu", "cann", "python"}
    assert seen["software"]["python"] == ".".join(map(str, sys.version_info[:3]))


def test_the_fingerprint_takes_cann_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(chip.CANN_VERSION_ENV, "8.0.RC3")
    code = "from tiletune.client import chip; print(chip.software_fingerprint()['cann'])"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "8.0.RC3"


def test_accelerator_names_follow_the_worker_format() -> None:
    h200 = SimpleNamespace(name="NVIDIA H200", major=9, minor=0)
    assert chip.cuda_chip_name(h200) == "cuda/NVIDIA H200/sm_90"
    assert chip.npu_chip_name("Ascend910B2") == "npu/Ascend910B2"


def fake_torch(*, cuda: bool, npu: bool) -> ModuleType:
    """A stand-in for torch as a caller with an accelerator would have imported it."""
    module = ModuleType("torch")
    module.cuda = SimpleNamespace(  # type: ignore[attr-defined]
        is_available=lambda: cuda,
        get_device_properties=lambda index: SimpleNamespace(name="NVIDIA H200", major=9, minor=0),
    )
    module.npu = SimpleNamespace(  # type: ignore[attr-defined]
        is_available=lambda: npu, get_device_name=lambda index: "Ascend910B2"
    )
    return module


def test_auto_uses_only_accelerators_the_caller_already_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", fake_torch(cuda=True, npu=True))
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    assert chip.detect_chip() == "cuda/NVIDIA H200/sm_90"  # torch_npu not imported: the NPU is not seen
    monkeypatch.setitem(sys.modules, "torch_npu", ModuleType("torch_npu"))
    assert chip.detect_chip() == "npu/Ascend910B2"
    assert chip.detect_chip("cuda") == "cuda/NVIDIA H200/sm_90"
    monkeypatch.setitem(sys.modules, "torch", fake_torch(cuda=False, npu=False))
    assert chip.detect_chip() == chip.cpu_chip_name()
    with pytest.raises(chip.ChipUnavailableError, match=r"^npu: "):
        chip.detect_chip("npu")


def test_an_unknown_kind_names_the_choices() -> None:
    with pytest.raises(ValueError, match="cpu, cuda, npu, auto"):
        chip.detect_chip("tpu")
