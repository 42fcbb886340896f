"""The native CPU kernels: every valid config agrees with the reference, the knobs are checked.

The extension is part of the product on CPUs: when it is not built these tests fail with the
reason (``make setup`` builds it), they never skip.
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.kernels.cases import NATIVE_KERNELS, TILED_FAMILIES
from tiletune.client.space import DeviceLimits
from tiletune.kernels.declaration import Shape
from tiletune.kernels.device import CpuDevice, cpu_chip
from tiletune.kernels.native.build import native_status
from tiletune.kernels.native.space import NATIVE_BACKEND
from tiletune.kernels.native.spec import NativeSpec, all_cores, preferred_backend
from tiletune.kernels.registry import builtin_kernels
from tiletune.tuner.measure.bench import KernelBench

from .cases import CPU, DIM_BOUNDS, SHAPES, assert_matches_reference, with_grouping

KERNELS = builtin_kernels()
LIMITS = cpu_chip().limits


@pytest.fixture(autouse=True)
def native_built() -> None:
    """Fail (not skip) with the reason when the extension is not built here."""
    status = native_status()
    if not status.available:
        pytest.fail(f"the native CPU backend is unavailable: {status.reason}")


def native(name: str) -> NativeSpec:
    spec = KERNELS[f"native_{name}"]
    assert isinstance(spec, NativeSpec)
    return spec


def test_native_kernels_are_registered_beside_the_portable_ones() -> None:
    for name in TILED_FAMILIES:
        spec = native(name)
        portable = KERNELS[name]
        assert spec.name in NATIVE_KERNELS
        assert spec.backends() == (NATIVE_BACKEND,)
        assert spec.supports("cpu")
        assert not spec.supports("cuda")
        assert not spec.supports("npu")
        assert [d.name for d in spec.dims] == [d.name for d in portable.dims]
        assert [k.name for k in spec.knobs] == [*(k.name for k in portable.knobs[:-2]), "block_dim"] + [
            k.name for k in portable.knobs[-2:]
        ]
        assert portable.backends() == ("torch", NATIVE_BACKEND)
        assert preferred_backend(portable, "cpu") == NATIVE_BACKEND
        assert preferred_backend(portable, "cuda") == "torch"


@pytest.mark.parametrize("name", TILED_FAMILIES)
def test_a_sample_of_valid_configs_matches_the_reference_in_float32(name: str) -> None:
    spec = native(name)
    rng = random.Random(name)
    for shape in SHAPES[name]:
        space = spec.space(shape, "float32", LIMITS)
        assert space, shape
        sample = [*rng.sample(space, min(12, len(space))), spec.default_config(shape, "float32", LIMITS)]
        assert_matches_reference(spec, shape, "float32", sample, backend=NATIVE_BACKEND, seed=5)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", TILED_FAMILIES)
def test_low_precision_configs_match_the_reference(name: str, dtype: str) -> None:
    spec = native(name)
    rng = random.Random(f"{name}/{dtype}")
    for shape in SHAPES[name]:
        space = spec.space(shape, dtype, LIMITS)
        assert_matches_reference(
            spec, shape, dtype, rng.sample(space, min(4, len(space))), backend=NATIVE_BACKEND, seed=5
        )


@st.composite
def shape_and_config(draw: st.DrawFn, name: str) -> tuple[Shape, dict[str, int]]:
    spec = native(name)
    shape: Shape = {}
    for dim in spec.dims:
        if dim.choices is not None:
            shape[dim.name] = draw(st.sampled_from(dim.choices))
        else:
            shape[dim.name] = draw(st.integers(1, DIM_BOUNDS[name][dim.name]))
    shape = with_grouping(shape)
    space = spec.space(shape, "float32", LIMITS)
    return shape, draw(st.sampled_from(space))


@pytest.mark.parametrize("name", TILED_FAMILIES)
def test_random_shapes_and_configs_match_the_reference(name: str) -> None:
    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(shape_and_config(name))
    def check(case: tuple[Shape, dict[str, int]]) -> None:
        shape, config = case
        assert_matches_reference(native(name), shape, "float32", [config], backend=NATIVE_BACKEND, seed=5)

    check()


@pytest.mark.parametrize("name", TILED_FAMILIES)
def test_the_portable_kernels_native_implementation_runs_their_configs(name: str) -> None:
    portable = KERNELS[name]
    for shape in SHAPES[name]:
        default = portable.default_config(shape, "float32", LIMITS)
        inputs = portable.make_inputs(shape, "float32", CPU, seed=2)
        got = portable.run(inputs, default, shape, NATIVE_BACKEND)
        want = portable.run(inputs, default, shape, "torch")
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_a_cpu_bench_of_a_portable_kernel_measures_the_native_implementation() -> None:
    spec = KERNELS["softmax"]
    bench = KernelBench(spec, {"rows": 8, "cols": 64}, "float32", CpuDevice())
    assert bench.implementation == NATIVE_BACKEND
    assert bench.check(spec.default_config({"rows": 8, "cols": 64}, "float32", LIMITS)) is None


def test_more_cores_than_tiles_is_invalid_and_the_default_never_idles_a_core() -> None:
    spec = native("add")
    shape = {"n": 300}
    one_tile = {"tile_size": 300, "block_dim": 2, "buffer_num": 1, "pipeline_depth": 1}
    if all_cores() >= 2:
        reason = spec.invalid_reason(one_tile, shape, "float32", LIMITS)
        assert reason is not None
        assert "block_dim=2" in reason
    for name in TILED_FAMILIES:
        for shape in SHAPES[name]:
            kernel = native(name)
            default = kernel.default_config(shape, "float32", LIMITS)
            assert default["block_dim"] <= kernel.tile_count(default, shape)
            assert kernel.invalid_reason(default, shape, "float32", LIMITS) is None


def test_block_dim_spans_one_to_the_cores_this_cpu_reports() -> None:
    values = native("add").knob_values({"n": 1 << 20}, cpu_chip().limits)["block_dim"]
    assert values[0] == 1
    assert values[-1] == all_cores()
    assert cpu_chip().limits.cores == all_cores()


def test_block_dim_is_one_core_where_the_chip_reports_none() -> None:
    """A space never depends on the machine that plans it: no cores known, one core."""
    assert native("add").knob_values({"n": 1 << 20})["block_dim"] == (1,)
    no_cores = DeviceLimits(local_memory_bytes=LIMITS.local_memory_bytes)
    assert native("add").default_config({"n": 1 << 20}, "float32", no_cores)["block_dim"] == 1


def test_every_knob_changes_nothing_but_the_speed_causal_and_not() -> None:
    spec = native("fused_attention")
    for causal, kv_heads, mask in ((0, 2, 0), (1, 2, 0), (2, 1, 1)):
        shape = {"batch": 1, "heads": 2, "kv_heads": kv_heads, "seq_q": 90, "seq_kv": 70, "head_dim": 16}
        shape |= {"causal": causal, "mask": mask}
        inputs = spec.make_inputs(shape, "float32", CPU)
        results = [spec.run(inputs, c, shape) for c in spec.space(shape, "float32", LIMITS)[::7]]
        for result in results[1:]:
            torch.testing.assert_close(result, results[0], atol=1e-5, rtol=1e-5)


def test_native_kernels_refuse_tensors_off_the_cpu_with_a_reason() -> None:
    spec = native("add")
    a = torch.ones(4, device="meta")
    with pytest.raises(ValueError, match="CPU tensors"):
        spec.run((a, a), {"tile_size": 4, "block_dim": 1, "buffer_num": 1, "pipeline_depth": 1}, {"n": 4})


def test_outputs_past_the_last_level_cache_are_streamed_and_still_exact() -> None:
    """Float32 outputs over the LLC (32 MiB here) take the streaming-store path, tails included."""
    dtype = "float32"
    n = (40 << 20) // 4 + 37
    spec = native("add")
    shape = {"n": n}
    inputs = spec.make_inputs(shape, dtype, CPU)
    for config in (
        {"tile_size": 4096, "block_dim": all_cores(), "buffer_num": 2, "pipeline_depth": 2},
        {"tile_size": 1000, "block_dim": 1, "buffer_num": 1, "pipeline_depth": 1},
    ):
        out = spec.run(inputs, config, shape)
        assert torch.equal(out, (inputs[0].float() + inputs[1].float()).to(out.dtype))
    rows = {"rows": 1000, "cols": (40 << 20) // 4 // 1000 + 3}
    for name in ("softmax", "rms_norm"):
        spec = native(name)
        whole_rows = {
            "tile_rows": 8,
            "tile_cols": 16384,
            "block_dim": all_cores(),
            "buffer_num": 2,
            "pipeline_depth": 2,
        }
        two_pass = {**whole_rows, "tile_cols": 4096, "buffer_num": 1, "pipeline_depth": 1}
        assert_matches_reference(spec, rows, dtype, [whole_rows, two_pass], backend=NATIVE_BACKEND)


def test_softmax_exp_handles_minus_infinity_and_huge_ranges() -> None:
    """Masked (-inf) entries give exactly 0; a row spanning the whole float range stays finite."""
    spec = native("softmax")
    x = torch.randn(5, 300)
    x[0, :17] = float("-inf")
    x[1, 5] = 1e30
    x[2] = torch.linspace(-1e30, 1e30, 300)
    shape = {"rows": 5, "cols": 300}
    for tile_cols in (64, 512):
        config = {
            "tile_rows": 2,
            "tile_cols": tile_cols,
            "block_dim": 1,
            "buffer_num": 2,
            "pipeline_depth": 2,
        }
        out = spec.run((x,), config, shape)
        torch.testing.assert_close(out, torch.softmax(x, -1), atol=1e-6, rtol=1e-5)
        assert (out[0, :17] == 0).all()
