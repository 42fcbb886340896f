"""The Triton kernels: checked against their references in Triton's interpreter, constraints, devices.

Kernels run on CPU tensors with ``TRITON_INTERPRET=1`` (set for this module
before the kernels are first loaded), on small shapes the blocks do not divide.
Knob rules for Ascend (triton-ascend) are pure logic and run here too; the
CUDA compile check runs only where a GPU is visible.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest
import torch

from tests.kernels.cases import TILED_FAMILIES, TRITON_KERNELS, one_tensor
from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.device import CpuDevice, ascend_limits
from tiletune.kernels.errors import DeviceUnavailableError
from tiletune.kernels.registry import builtin_kernels
from tiletune.kernels.spec import DeviceLimits
from tiletune.kernels.triton import spec as triton_spec
from tiletune.kernels.triton.spec import INTERPRET_ENV, TritonSpec, triton_installed
from tiletune.tuner.measure.bench import BenchSettings, KernelBench

KERNELS = builtin_kernels()


def triton_specs() -> dict[str, TritonSpec]:
    specs: dict[str, TritonSpec] = {}
    for name in TRITON_KERNELS:
        spec = KERNELS[name]
        assert isinstance(spec, TritonSpec), name
        specs[name] = spec
    return specs


SPECS = triton_specs()
CPU = CpuDevice()
H200 = DeviceLimits(local_memory_bytes=227 * 1024, max_buffer_num=8, alignment_bytes=16, kind="cuda")
NPU = ascend_limits("Ascend910B2")
TINY_GPU = DeviceLimits(local_memory_bytes=8192, kind="cuda")

needs_triton = pytest.mark.skipif(not triton_installed(), reason="triton is not installed (tiletune[triton])")

#: (shape, configs besides the default) per kernel: uneven shapes, one-pass and two-pass, causal and not.
CASES: dict[str, list[tuple[Shape, list[Config]]]] = {
    "triton_add": [
        ({"n": 1}, [{"block_size": 16, "num_stages": 4, "num_warps": 1}]),
        (
            {"n": 3000},
            [
                {"block_size": 16, "num_stages": 2, "num_warps": 1},
                {"block_size": 1024, "num_stages": 1, "num_warps": 8},
                {"block_size": 4096, "num_stages": 3, "num_warps": 4},
            ],
        ),
    ],
    "triton_softmax": [
        ({"rows": 5, "cols": 7}, [{"block_rows": 2, "block_cols": 16, "num_stages": 1, "num_warps": 2}]),
        (
            {"rows": 37, "cols": 300},
            [
                {"block_rows": 8, "block_cols": 64, "num_stages": 3, "num_warps": 4},
                {"block_rows": 1, "block_cols": 512, "num_stages": 1, "num_warps": 8},
                {"block_rows": 64, "block_cols": 128, "num_stages": 2, "num_warps": 1},
            ],
        ),
    ],
    "triton_softmax_backward": [
        ({"rows": 1, "cols": 1}, [{"block_rows": 1, "block_cols": 16, "num_stages": 1, "num_warps": 1}]),
        (
            {"rows": 37, "cols": 300},
            [
                {"block_rows": 4, "block_cols": 32, "num_stages": 3, "num_warps": 2},
                {"block_rows": 2, "block_cols": 512, "num_stages": 1, "num_warps": 8},
                {"block_rows": 64, "block_cols": 128, "num_stages": 2, "num_warps": 4},
            ],
        ),
    ],
    "triton_rms_norm": [
        ({"rows": 3, "cols": 7}, [{"block_rows": 1, "block_cols": 16, "num_stages": 1, "num_warps": 1}]),
        (
            {"rows": 37, "cols": 300},
            [
                {"block_rows": 4, "block_cols": 32, "num_stages": 4, "num_warps": 2},
                {"block_rows": 16, "block_cols": 512, "num_stages": 1, "num_warps": 4},
            ],
        ),
    ],
    "triton_rms_norm_backward": [
        ({"rows": 1, "cols": 1}, [{"block_rows": 1, "block_cols": 16, "num_stages": 1, "num_warps": 1}]),
        (
            {"rows": 37, "cols": 300},
            [
                {"block_rows": 4, "block_cols": 64, "num_stages": 3, "num_warps": 2},
                {"block_rows": 2, "block_cols": 512, "num_stages": 1, "num_warps": 8},
                {"block_rows": 64, "block_cols": 128, "num_stages": 2, "num_warps": 4},
            ],
        ),
    ],
    "triton_matmul": [
        (
            {"m": 1, "n": 1, "k": 1},
            [{"block_m": 16, "block_n": 16, "block_k": 16, "num_stages": 1, "num_warps": 1}],
        ),
        (
            {"m": 37, "n": 50, "k": 70},
            [
                {"block_m": 16, "block_n": 16, "block_k": 16, "num_stages": 2, "num_warps": 4},
                {"block_m": 32, "block_n": 64, "block_k": 32, "num_stages": 3, "num_warps": 8},
                {"block_m": 64, "block_n": 64, "block_k": 128, "num_stages": 1, "num_warps": 4},
            ],
        ),
    ],
    "triton_fused_attention": [
        (
            {"batch": 2, "heads": 2, "seq_q": 37, "seq_kv": 50, "head_dim": 8, "causal": 1},
            [
                {"block_q": 16, "block_kv": 16, "num_stages": 2, "num_warps": 4},
                {"block_q": 32, "block_kv": 64, "num_stages": 1, "num_warps": 2},
            ],
        ),
        (
            {"batch": 1, "heads": 2, "seq_q": 50, "seq_kv": 33, "head_dim": 16, "causal": 0},
            [
                {"block_q": 16, "block_kv": 32, "num_stages": 3, "num_warps": 4},
                {"block_q": 64, "block_kv": 16, "num_stages": 2, "num_warps": 8},
            ],
        ),
        (
            {
                "batch": 1,
                "heads": 2,
                "kv_heads": 1,
                "seq_q": 40,
                "seq_kv": 20,
                "head_dim": 24,
                "causal": 2,
                "mask": 1,
            },
            [{"block_q": 16, "block_kv": 16, "num_stages": 2, "num_warps": 1}],
        ),
    ],
    "triton_fused_attention_backward": [
        (
            {
                "batch": 1,
                "heads": 2,
                "kv_heads": 1,
                "seq_q": 40,
                "seq_kv": 20,
                "head_dim": 24,
                "causal": 2,
                "mask": 1,
            },
            [{"block_q": 16, "block_kv": 16, "num_stages": 2, "num_warps": 1}],
        ),
        (
            {"batch": 1, "heads": 2, "seq_q": 37, "seq_kv": 50, "head_dim": 8, "causal": 1},
            [
                {"block_q": 16, "block_kv": 16, "num_stages": 2, "num_warps": 4},
                {"block_q": 32, "block_kv": 64, "num_stages": 1, "num_warps": 2},
            ],
        ),
    ],
}


@pytest.fixture(scope="module", autouse=True)
def interpreter() -> Iterator[None]:
    """Triton's interpreter for this module: set before the kernels module is first imported."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(INTERPRET_ENV, "1")
        yield


def bench(name: str, shape: Shape, dtype: str) -> KernelBench:
    settings = BenchSettings(warmup_runs=0, min_samples=1, max_samples=1, budget_s=0.0)
    return KernelBench(SPECS[name], shape, dtype, CPU, backend="triton", settings=settings)


# -- correctness in the interpreter -------------------------------------------------


@needs_triton
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("name", TRITON_KERNELS)
def test_configs_match_the_reference_on_shapes_blocks_do_not_divide(name: str, dtype: str) -> None:
    spec = SPECS[name]
    for written, configs in CASES[name]:
        shape = spec.parse_shape(written)  # dims a case leaves out take their defaults
        kernel_bench = bench(name, shape, dtype)
        for config in [spec.default_config(shape, dtype, CPU.chip.limits), *configs]:
            assert spec.parse_config(config, shape) == config
            assert kernel_bench.check(config) is None, (name, shape, dtype, config)


@needs_triton
def test_triton_kernels_keep_the_callers_sizes_and_dtype() -> None:
    x = torch.randn(3, 4, 50, dtype=torch.float16)
    config = {"block_rows": 4, "block_cols": 16, "num_stages": 2, "num_warps": 4}
    out = one_tensor(SPECS["triton_softmax"].run((x,), config, {"rows": 12, "cols": 50}))
    assert out.shape == x.shape
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.float(), torch.softmax(x.float(), -1), atol=2e-3, rtol=2e-3)


@needs_triton
def test_a_config_that_fails_to_compile_is_a_failed_trial_with_its_reason() -> None:
    result = bench("triton_add", {"n": 100}, "float32").check(
        {"block_size": 24, "num_stages": 1, "num_warps": 4}
    )
    assert result is not None
    assert result.invalid is None
    assert result.error
    assert "power of 2" in result.error


@needs_triton
def test_cpu_tensors_without_the_interpreter_are_a_clear_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(INTERPRET_ENV)
    config = {"block_size": 16, "num_stages": 1, "num_warps": 4}
    result = bench("triton_add", {"n": 100}, "float32").check(config)
    assert result is not None
    assert result.error is not None
    assert f"set {INTERPRET_ENV}=1" in result.error
    a = torch.ones(100)
    with pytest.raises(DeviceUnavailableError, match="only in its interpreter"):
        SPECS["triton_add"].run((a, a), config, {"n": 100})


def test_triton_kernels_accept_only_the_triton_backend() -> None:
    spec = SPECS["triton_add"]
    a = torch.ones(4)
    with pytest.raises(ValueError, match="no backend 'torch'"):
        spec.run((a, a), {"block_size": 16, "num_stages": 1, "num_warps": 4}, {"n": 4}, "torch")


# -- knob spaces and constraints ---------------------------------------------------


def test_block_knobs_clamp_to_the_power_of_two_covering_their_dim() -> None:
    assert SPECS["triton_add"].knob_values({"n": 3000})["block_size"] == (
        16,
        32,
        64,
        128,
        256,
        512,
        1024,
        2048,
        4096,
    )
    assert SPECS["triton_add"].knob_values({"n": 1})["block_size"] == (16,)
    rows = SPECS["triton_softmax"].knob_values({"rows": 5, "cols": 7})
    assert rows["block_rows"] == (1, 2, 4, 8)
    assert rows["block_cols"] == (16,)
    matmul = SPECS["triton_matmul"].knob_values({"m": 1, "n": 40, "k": 1000})
    assert (matmul["block_m"], matmul["block_n"], matmul["block_k"]) == (
        (16,),
        (16, 32, 64),
        (16, 32, 64, 128),
    )
    for spec in SPECS.values():
        values = spec.knob_values({d.name: d.choices[0] if d.choices else 1000 for d in spec.dims})
        assert values["num_stages"] == (1, 2, 3, 4)
        assert values["num_warps"] == (1, 2, 4, 8)


#: One config per kernel and its working set in bytes (float16), from the documented formulas.
WORKING_SETS: list[tuple[str, Shape, Config, int]] = [
    ("triton_add", {"n": 100000}, {"block_size": 1024, "num_stages": 3, "num_warps": 4}, 2 * 1024 * 2 * 3),
    (
        "triton_softmax",
        {"rows": 64, "cols": 4096},
        {"block_rows": 4, "block_cols": 256, "num_stages": 2, "num_warps": 4},
        4 * 256 * 2 * 2,
    ),
    (
        "triton_rms_norm",
        {"rows": 64, "cols": 4096},
        {"block_rows": 4, "block_cols": 256, "num_stages": 2, "num_warps": 4},
        (4 + 1) * 256 * 2 * 2,
    ),
    (
        "triton_matmul",
        {"m": 512, "n": 512, "k": 512},
        {"block_m": 128, "block_n": 64, "block_k": 32, "num_stages": 3, "num_warps": 4},
        (128 * 32 + 32 * 64) * 2 * 3,
    ),
    (
        "triton_fused_attention",
        {"batch": 1, "heads": 1, "seq_q": 512, "seq_kv": 512, "head_dim": 80, "causal": 1},
        {"block_q": 64, "block_kv": 32, "num_stages": 2, "num_warps": 4},
        (64 + 2 * 32) * 128 * 2 * 2,  # head_dim 80 is held padded to 128
    ),
]


@pytest.mark.parametrize(("name", "shape", "config", "expected"), WORKING_SETS)
def test_working_sets_follow_the_documented_formulas(
    name: str, shape: Shape, config: Config, expected: int
) -> None:
    spec = SPECS[name]
    assert spec.working_set_bytes(config, shape, "float16") == expected
    assert spec.invalid_reason(config, shape, "float16", H200) is None
    small = DeviceLimits(local_memory_bytes=expected - 1, kind="cuda")
    reason = spec.invalid_reason(config, shape, "float16", small)
    assert reason == (
        f"working set {expected} B (blocks in flight x num_stages={config['num_stages']}) "
        f"exceeds local memory {expected - 1} B (shared memory per block)"
    )


@pytest.mark.parametrize("name", TRITON_KERNELS)
def test_a_small_local_memory_leaves_only_configs_that_fit(name: str) -> None:
    spec = SPECS[name]
    shape, _ = CASES[name][-1]
    full = spec.space(shape, "float32", H200)
    small = spec.space(shape, "float32", TINY_GPU)
    assert small
    assert len(small) < len(full)
    assert all(spec.working_set_bytes(c, shape, "float32") <= TINY_GPU.local_memory_bytes for c in small)
    rejected = next(c for c in full if c not in small)
    assert "exceeds local memory 8192 B" in str(spec.invalid_reason(rejected, shape, "float32", TINY_GPU))


def test_num_stages_needs_a_loop_to_pipeline() -> None:
    matmul = SPECS["triton_matmul"]
    shape = {"m": 64, "n": 64, "k": 64}
    one_step = {"block_m": 64, "block_n": 64, "block_k": 64, "num_stages": 2, "num_warps": 4}
    assert "nothing to pipeline" in str(matmul.invalid_reason(one_step, shape, "float32", H200))
    assert matmul.invalid_reason({**one_step, "num_stages": 1}, shape, "float32", H200) is None
    assert matmul.invalid_reason({**one_step, "block_k": 32}, shape, "float32", H200) is None
    softmax = SPECS["triton_softmax"]
    whole_rows = {"block_rows": 4, "block_cols": 512, "num_stages": 3, "num_warps": 4}
    assert "nothing to pipeline" in str(
        softmax.invalid_reason(whole_rows, {"rows": 8, "cols": 300}, "float32", H200)
    )


@pytest.mark.parametrize("name", TRITON_KERNELS)
def test_npu_rejects_warps_and_more_than_double_buffering(name: str) -> None:
    spec = SPECS[name]
    shape, configs = CASES[name][-1]
    config = {**configs[0], "num_warps": 4, "num_stages": 2}
    assert spec.invalid_reason(config, shape, "float16", NPU) == (
        "num_warps=4: Ascend NPUs have no warps (triton-ascend ignores it); use 1"
    )
    config = {**config, "num_warps": 1, "num_stages": 3}
    assert spec.invalid_reason(config, shape, "float16", NPU) == (
        "num_stages=3: on Ascend it is multibuffer, off (1) or on (2)"
    )
    space = spec.space(shape, "float16", NPU)
    assert space
    assert {c["num_warps"] for c in space} == {1}
    assert {c["num_stages"] for c in space} <= {1, 2}
    assert len(spec.space(shape, "float16", H200)) > len(space)


def test_npu_working_set_is_checked_against_the_unified_buffer() -> None:
    spec = SPECS["triton_matmul"]
    shape = {"m": 1024, "n": 1024, "k": 1024}
    big = {"block_m": 256, "block_n": 256, "block_k": 128, "num_stages": 2, "num_warps": 1}
    assert NPU.local_memory_bytes == 192 * 1024
    assert "(unified buffer per AI core)" in str(spec.invalid_reason(big, shape, "float32", NPU))


# -- default configs ------------------------------------------------------------------

#: (kernel, shape, dtype, expected default on a GPU) for the rule's three regimes.
DEFAULTS: list[tuple[str, Shape, str, Config]] = [
    ("triton_add", {"n": 1000}, "float32", {"block_size": 1024, "num_stages": 1, "num_warps": 4}),
    ("triton_add", {"n": 3000}, "float32", {"block_size": 256, "num_stages": 2, "num_warps": 4}),
    ("triton_add", {"n": 1 << 20}, "float16", {"block_size": 1024, "num_stages": 3, "num_warps": 4}),
    (
        "triton_softmax",
        {"rows": 5, "cols": 7},
        "float32",
        {"block_rows": 8, "block_cols": 16, "num_stages": 1, "num_warps": 4},
    ),
    (
        "triton_softmax",
        {"rows": 37, "cols": 300},
        "float32",
        {"block_rows": 1, "block_cols": 256, "num_stages": 2, "num_warps": 4},
    ),
    (
        "triton_rms_norm",
        {"rows": 4096, "cols": 128},
        "float16",
        {"block_rows": 8, "block_cols": 128, "num_stages": 1, "num_warps": 4},
    ),
    (
        "triton_matmul",
        {"m": 4096, "n": 4096, "k": 4096},
        "float16",
        {"block_m": 32, "block_n": 32, "block_k": 32, "num_stages": 3, "num_warps": 4},
    ),
    (
        "triton_matmul",
        {"m": 20, "n": 30, "k": 40},
        "float32",
        {"block_m": 32, "block_n": 32, "block_k": 64, "num_stages": 1, "num_warps": 4},
    ),
    (
        "triton_fused_attention",
        {"batch": 4, "heads": 16, "seq_q": 2048, "seq_kv": 2048, "head_dim": 128, "causal": 1},
        "bfloat16",
        {"block_q": 32, "block_kv": 32, "num_stages": 3, "num_warps": 4},
    ),
]


@pytest.mark.parametrize(("name", "shape", "dtype", "expected"), DEFAULTS)
def test_default_is_the_hand_written_rule_on_the_triton_knobs(
    name: str, shape: Shape, dtype: str, expected: Config
) -> None:
    spec = SPECS[name]
    assert spec.default_config(shape, dtype, H200) == expected
    assert spec.invalid_reason(expected, shape, dtype, H200) is None
    on_npu = spec.default_config(shape, dtype, NPU)
    assert on_npu == {**expected, "num_stages": min(2, expected["num_stages"]), "num_warps": 1}
    assert spec.invalid_reason(on_npu, shape, dtype, NPU) is None


@pytest.mark.parametrize("name", TRITON_KERNELS)
def test_default_is_valid_on_every_test_shape(name: str) -> None:
    spec = SPECS[name]
    for shape, _ in CASES[name]:
        for limits in (CPU.chip.limits, H200, NPU):
            default = spec.default_config(shape, "float16", limits)
            assert spec.parse_config(default, shape) == default
            assert spec.invalid_reason(default, shape, "float16", limits) is None, (shape, limits)


# -- devices and launch options ---------------------------------------------------------


def test_supports_cuda_with_triton_cpu_only_in_the_interpreter_npu_with_triton_ascend(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = SPECS["triton_matmul"]
    monkeypatch.setattr(triton_spec, "triton_installed", lambda: True)
    monkeypatch.setattr(triton_spec, "triton_ascend_installed", lambda: False)
    monkeypatch.setenv(INTERPRET_ENV, "1")
    assert (spec.supports("cuda"), spec.supports("cpu"), spec.supports("npu")) == (True, True, False)
    monkeypatch.setenv(INTERPRET_ENV, "0")
    assert (spec.supports("cuda"), spec.supports("cpu")) == (True, False)
    monkeypatch.setattr(triton_spec, "triton_ascend_installed", lambda: True)
    assert spec.supports("npu")
    assert not spec.supports("tpu")
    monkeypatch.setattr(triton_spec, "triton_installed", lambda: False)
    assert not spec.supports("cuda")
    for name in TILED_FAMILIES:  # the portable kernels run everywhere
        assert all(KERNELS[name].supports(kind) for kind in ("cpu", "cuda", "npu"))


def test_triton_ascend_is_found_by_its_distribution(monkeypatch: pytest.MonkeyPatch) -> None:
    installed: set[str] = set()

    def distribution(name: str) -> object:
        if name not in installed:
            raise importlib.metadata.PackageNotFoundError(name)
        return object()

    monkeypatch.setattr(importlib.metadata, "distribution", distribution)
    monkeypatch.setattr(triton_spec, "triton_installed", lambda: True)
    assert not triton_spec.triton_ascend_installed()
    installed.add("triton-ascend")
    assert triton_spec.triton_ascend_installed()


def test_launch_options_map_the_knobs_per_device_kind() -> None:
    spec = SPECS["triton_fused_attention"]
    config = {"block_q": 64, "block_kv": 64, "num_stages": 3, "num_warps": 8}
    assert spec.launch_options(config, "cuda") == {"num_warps": 8, "num_stages": 3}
    assert spec.launch_options(config, "cpu") == {"num_warps": 8, "num_stages": 3}
    assert spec.launch_options({**config, "num_stages": 2, "num_warps": 1}, "npu") == {"multibuffer": True}
    assert spec.launch_options({**config, "num_stages": 1, "num_warps": 1}, "npu") == {"multibuffer": False}


def test_device_limits_carry_the_device_kind() -> None:
    assert CPU.chip.limits.kind == "cpu"
    assert NPU.kind == "npu"
    assert ascend_limits("Ascend999").kind == "npu"


# -- without triton, and from the command line ---------------------------------------


def run_python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_specs_import_list_and_constrain_without_triton() -> None:
    result = run_python(
        """
        import sys
        sys.modules["triton"] = None  # as if triton were not installed
        import torch
        from tiletune.kernels.device import cpu_chip
        from tiletune.kernels.errors import DeviceUnavailableError
        from tiletune.kernels.family import builtin_families
        from tiletune.kernels.registry import builtin_kernels

        kernels = builtin_kernels()
        implementations = [i for f in builtin_families().values() for i in f.implementations]
        triton = [i.kernel for i in implementations if i.backend == "triton"]
        assert len(triton) == 8
        for name in triton:
            spec = kernels[name]
            assert not any(spec.supports(kind) for kind in ("cpu", "cuda", "npu")), name
        spec = kernels["triton_add"]
        shape = {"n": 100}
        assert spec.space(shape, "float32", cpu_chip().limits)
        config = spec.default_config(shape, "float32", cpu_chip().limits)
        a = torch.ones(100)
        try:
            spec.run((a, a), config, shape)
        except DeviceUnavailableError as error:
            print(error)
        assert sys.modules["triton"] is None
        """,
        env={INTERPRET_ENV: "1"},
    )
    assert result.returncode == 0, result.stderr
    assert "triton_add: triton is not installed; install tiletune[triton]" in result.stdout


@needs_triton
def test_tiletune_tune_runs_a_triton_kernel_in_the_interpreter() -> None:
    command = [sys.executable, "-m", "tiletune.service.cli", "tune", "triton_add", "--shape", "n=3000"]
    command += ["--dtype", "float32", "--backend", "cpu", "--trials", "4", "--json"]
    result = subprocess.run(
        command,
        env={**os.environ, INTERPRET_ENV: "1"},
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["kernel"] == "triton_add"
    assert report["trials"]["completed"] >= 1
    # torch.add beats a kernel interpreted in Python: the answer is torch's op
    assert (report["best"]["implementation"], report["best"]["config"]) == ("vendor", {"vendor": 1})
    triton_configs = [row["config"] for row in report["validated"] if row["config"] != {"vendor": 1}]
    assert all(set(config) == {"block_size", "num_stages", "num_warps"} for config in triton_configs)
    assert report["default"]["config"] == {"block_size": 256, "num_stages": 2, "num_warps": 4}
    assert report["space_size"] > 0


@needs_triton
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible: Triton's compiled path")
def test_kernels_compile_and_match_on_a_gpu() -> None:
    result = run_python(
        """
        from tiletune.kernels.device import get_device
                from tiletune.kernels.registry import builtin_kernels
        from tiletune.tuner.measure.bench import KernelBench

        device = get_device("cuda")
        shapes = {
            "triton_add": {"n": 100003},
            "triton_softmax": {"rows": 300, "cols": 1000},
            "triton_softmax_backward": {"rows": 300, "cols": 1000},
            "triton_rms_norm": {"rows": 300, "cols": 1000},
            "triton_rms_norm_backward": {"rows": 300, "cols": 1000},
            "triton_matmul": {"m": 300, "n": 200, "k": 500},
            "triton_fused_attention": {
                "batch": 2, "heads": 4, "seq_q": 300, "seq_kv": 500, "head_dim": 64, "causal": 1
            },
            "triton_fused_attention_backward": {
                "batch": 2, "heads": 4, "seq_q": 300, "seq_kv": 500, "head_dim": 64, "causal": 1
            },
        }
        for name in shapes:
            spec, shape = builtin_kernels()[name], shapes[name]
            for dtype in ("float32", "float16", "bfloat16"):
                bench = KernelBench(spec, shape, dtype, device)
                space = spec.space(shape, dtype, device.chip.limits)
                default = spec.default_config(shape, dtype, device.chip.limits)
                for config in [default, space[0], space[len(space) // 2], space[-1]]:
                    verdict = bench.check(config)
                    assert verdict is None or "OutOfResources" in str(verdict.error), (name, dtype, verdict)
        print("ok")
        """,
        env={INTERPRET_ENV: "0"},
    )
    assert result.returncode == 0, result.stderr
