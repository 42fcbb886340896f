"""``softmax_backward`` (portable, native, Triton in its interpreter) against torch's autograd of the
forward: ``torch.autograd.grad(torch.softmax(x, -1), x, grad)`` in float64, the kernels given
``y = softmax(x)`` and ``grad``.

Float32 runs are held tightly to the float64 gradient; float16 and bfloat16 runs to the tolerances
below (their inputs are rounded to the dtype, and so is ``dx``). Shapes include ones no tile
divides, leading dims, whole-row and column tiles, and every ``buffer_num`` / ``pipeline_depth``.
The native extension is part of the product on CPUs: when it is not built, its tests fail with the
reason (``make setup`` builds it).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.device import cpu_chip
from tiletune.kernels.errors import ShapeError
from tiletune.kernels.native.build import native_status
from tiletune.kernels.native.spec import all_cores
from tiletune.kernels.pipeline import tracing
from tiletune.kernels.softmax.portable import SPEC as SOFTMAX
from tiletune.kernels.softmax_backward.native import SPEC as NATIVE
from tiletune.kernels.softmax_backward.portable import SPEC as PORTABLE
from tiletune.kernels.softmax_backward.triton import SPEC as TRITON
from tiletune.kernels.spec import KernelSpec
from tiletune.kernels.triton.spec import INTERPRET_ENV, triton_installed

LIMITS = cpu_chip().limits
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
#: (atol, rtol) against the float64 gradient: float32 tight; the half types after rounding their inputs
#: (``g``'s rounding alone moves ``dx`` by up to ``|y g|`` times 2^-11 for float16, 2^-8 for bfloat16,
#: which ``g - s`` can leave next to a ``dx`` near 0: short rows, where ``y`` is large).
TOLERANCE = {"float32": (1e-7, 1e-5), "float16": (1e-3, 1e-2), "bfloat16": (5e-3, 4e-2)}
#: Leading dims and rows x cols: 1 x 1, no tile divides 37 x 300 or 5 x 1000, batched 3 x 4 x 50.
SIZES = ((1, 1), (37, 300), (5, 1000), (3, 4, 50))
#: (tile_rows, tile_cols): whole rows (one pass) and column tiles (two passes) over SIZES.
TILES = ((1, 1024), (16, 1024), (4, 32), (8, 128), (2, 64))
PIPELINES = [(b, d) for b, d in itertools.product((1, 2, 3, 4), (1, 2, 3)) if d == 1 or b >= 2]

needs_triton = pytest.mark.skipif(not triton_installed(), reason="triton is not installed (tiletune[triton])")


@pytest.fixture(scope="module", autouse=True)
def interpreter() -> Iterator[None]:
    """Triton's interpreter for this module: set before the kernels module is first imported."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(INTERPRET_ENV, "1")
        yield


@pytest.fixture
def native_built() -> None:
    """Fail (not skip) with the reason when the extension is not built here."""
    status = native_status()
    if not status.available:
        pytest.fail(f"the native CPU backend is unavailable: {status.reason}")


def autograd_case(
    sizes: tuple[int, ...], dtype: str, seed: int = 0
) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor, Shape]:
    """``(y, grad)`` in ``dtype`` and torch's float64 gradient of ``softmax`` at ``x``, and the shape."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(sizes, generator=generator, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(sizes, generator=generator, dtype=torch.float64)
    y = torch.softmax(x, -1)
    (expected,) = torch.autograd.grad(y, x, grad)
    inputs = (y.detach().to(DTYPES[dtype]), grad.to(DTYPES[dtype]))
    return inputs, expected, PORTABLE.shape_of(inputs)


def check(spec: KernelSpec, sizes: tuple[int, ...], dtype: str, configs: list[Config], backend: str) -> None:
    """Each config's ``dx`` on ``backend`` is torch's gradient within ``dtype``'s tolerance."""
    inputs, expected, shape = autograd_case(sizes, dtype)
    atol, rtol = TOLERANCE[dtype]
    for config in configs:
        dx = spec.run(inputs, config, shape, backend)
        assert isinstance(dx, torch.Tensor)
        assert dx.dtype == inputs[0].dtype
        assert dx.shape == inputs[0].shape
        try:
            torch.testing.assert_close(dx.double(), expected, atol=atol, rtol=rtol)
        except AssertionError as error:
            raise AssertionError(f"{spec.name} {sizes} {dtype} {config}: {error}") from None


def row_configs(shape: Shape, *, cores: int | None = None) -> list[Config]:
    """Every TILES x PIPELINES config valid for ``shape`` (clamped to it), with ``block_dim`` when given."""
    values = PORTABLE.knob_values(shape)
    configs = []
    for (rows, cols), (buffers, depth) in itertools.product(TILES, PIPELINES):
        config = {
            "tile_rows": min(rows, values["tile_rows"][-1]),
            "tile_cols": min(cols, values["tile_cols"][-1]),
            "buffer_num": buffers,
            "pipeline_depth": depth,
        }
        if cores is not None:
            tiles = -(-shape["rows"] // config["tile_rows"])
            config = {**config, "block_dim": min(cores, tiles)}
        configs.append(config)
    return configs


# -- the reference ---------------------------------------------------------------------------------


def test_the_reference_is_torchs_gradient_in_float64_and_float32() -> None:
    inputs, expected, shape = autograd_case((6, 70), "float32")
    as_float64 = tuple(t.double() for t in inputs)
    reference64 = PORTABLE.reference(as_float64, shape)
    assert reference64.dtype == torch.float64
    torch.testing.assert_close(reference64, expected, atol=1e-7, rtol=1e-6)  # float32 inputs' rounding
    reference32 = PORTABLE.reference(inputs, shape)
    assert reference32.dtype == torch.float32
    torch.testing.assert_close(reference32.double(), expected, atol=2e-7, rtol=1e-5)
    low = tuple(t.bfloat16() for t in inputs)
    assert PORTABLE.reference(low, shape).dtype == torch.float32  # half types in float32


# -- every implementation against autograd ---------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("sizes", SIZES)
def test_portable_matches_autograd_for_every_tiling_and_pipeline(sizes: tuple[int, ...], dtype: str) -> None:
    _, _, shape = autograd_case(sizes, dtype)
    check(PORTABLE, sizes, dtype, row_configs(shape), "torch")


@pytest.mark.usefixtures("native_built")
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("sizes", SIZES)
def test_native_matches_autograd_for_every_tiling_pipeline_and_core_count(
    sizes: tuple[int, ...], dtype: str
) -> None:
    _, _, shape = autograd_case(sizes, dtype)
    configs = [*row_configs(shape, cores=1), *row_configs(shape, cores=all_cores())]
    check(NATIVE, sizes, dtype, configs, "native")
    check(PORTABLE, sizes, dtype, row_configs(shape)[:4], "native")  # the portable kernel's native run


#: (block_rows, block_cols, num_stages): one pass (blocks cover the row) and two passes, pipelined.
TRITON_BLOCKS = ((1, 16, 1), (4, 32, 3), (2, 64, 2), (8, 1024, 1), (64, 128, 4))


@needs_triton
@pytest.mark.parametrize("dtype", ["float32", "float16"])  # bf16 tl ops are not exact in the interpreter
@pytest.mark.parametrize("sizes", SIZES)
def test_triton_matches_autograd_in_the_interpreter(sizes: tuple[int, ...], dtype: str) -> None:
    _, _, shape = autograd_case(sizes, dtype)
    values = TRITON.knob_values(shape)
    configs = []
    for rows, cols, stages in TRITON_BLOCKS:
        config = {
            "block_rows": min(rows, values["block_rows"][-1]),
            "block_cols": min(cols, values["block_cols"][-1]),
            "num_stages": stages,
            "num_warps": 4,
        }
        if TRITON.loop_steps(config, shape) == 1:
            config["num_stages"] = 1
        configs.append(config)
    check(TRITON, sizes, dtype, configs, "triton")


@st.composite
def random_case(draw: st.DrawFn) -> tuple[tuple[int, int], Config, str]:
    """A random shape up to 40 x 300, a random valid native config for it, a random dtype."""
    sizes = (draw(st.integers(1, 40)), draw(st.integers(1, 300)))
    dtype = draw(st.sampled_from(["float32", "float32", "float16", "bfloat16"]))
    shape = {"rows": sizes[0], "cols": sizes[1]}
    return sizes, draw(st.sampled_from(NATIVE.space(shape, dtype, LIMITS))), dtype


@pytest.mark.usefixtures("native_built")
@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(case=random_case())
def test_random_shapes_and_configs_match_autograd(case: tuple[tuple[int, int], Config, str]) -> None:
    sizes, config, dtype = case
    check(NATIVE, sizes, dtype, [config], "native")
    portable = {name: value for name, value in config.items() if name != "block_dim"}
    check(PORTABLE, sizes, dtype, [portable], "torch")


@pytest.mark.usefixtures("native_built")
def test_non_contiguous_inputs_give_the_same_gradient() -> None:
    inputs, expected, shape = autograd_case((30, 40), "float32")
    transposed = tuple(t.t().contiguous().t() for t in inputs)
    assert not transposed[0].is_contiguous()
    config = {"tile_rows": 4, "tile_cols": 32, "buffer_num": 2, "pipeline_depth": 3}
    for spec, run_config in ((PORTABLE, config), (NATIVE, {**config, "block_dim": 1})):
        dx = spec.run(transposed, run_config, shape, spec.backends()[-1])
        torch.testing.assert_close(dx.double(), expected, atol=2e-7, rtol=1e-5)


# -- the knobs change execution -------------------------------------------------------------------------


def test_column_tiles_take_two_passes_and_buffers_rotate_their_slots() -> None:
    inputs, _, shape = autograd_case((10, 100), "float32")
    whole = {"tile_rows": 4, "tile_cols": 128, "buffer_num": 2, "pipeline_depth": 2}
    with tracing() as trace:
        PORTABLE.run(inputs, whole, shape)
    assert len(trace.of("compute")) == 3  # one step per row tile
    columns = {"tile_rows": 4, "tile_cols": 32, "buffer_num": 3, "pipeline_depth": 3}
    with tracing() as trace:
        PORTABLE.run(inputs, columns, shape)
    assert len(trace.of("compute")) == 3 * 2 * 4  # both passes over 4 column tiles, per row tile
    assert len(trace.of("copy_out")) == 3 * 4
    assert {event.slot for event in trace.of("copy_in")} == {0, 1, 2}
    assert trace.max_in_flight <= 3


# -- declaration ------------------------------------------------------------------------------------


def test_the_default_is_the_forwards_hand_written_rule() -> None:
    for shape in ({"rows": 20, "cols": 50}, {"rows": 1000, "cols": 64}, {"rows": 4096, "cols": 4096}):
        for dtype in ("float32", "bfloat16"):
            forward = SOFTMAX.default_config(shape, dtype, LIMITS)
            assert PORTABLE.default_config(shape, dtype, LIMITS) == forward


def test_the_working_set_counts_three_queues_the_row_sums_and_the_half_types_scratch() -> None:
    shape = {"rows": 64, "cols": 4096}
    config = {"tile_rows": 4, "tile_cols": 256, "buffer_num": 2, "pipeline_depth": 2}
    tile, sums = 4 * 256, 2 * 4 * 4  # the row sums: running and per tile, float32, per row
    assert PORTABLE.working_set_bytes(config, shape, "float32") == 3 * 2 * tile * 4 + sums
    assert PORTABLE.working_set_bytes(config, shape, "bfloat16") == 3 * 2 * tile * 2 + sums + 2 * tile * 4
    blocks = {"block_rows": 4, "block_cols": 256, "num_stages": 3, "num_warps": 4}
    assert TRITON.working_set_bytes(blocks, shape, "float16") == 2 * 4 * 256 * 2 * 3


def test_tensors_counts_and_names() -> None:
    shape = {"rows": 8, "cols": 100}
    assert PORTABLE.tensor_bytes(shape, "bfloat16") == {"y": 1600, "grad": 1600, "dx": 1600}
    assert PORTABLE.bytes_moved(shape, "float32") == 3 * 800 * 4
    assert PORTABLE.flops(shape) == 4 * 800
    assert [d.name for d in PORTABLE.dims] == ["rows", "cols"]  # the forward's dims: one key for both
    assert [d.name for d in PORTABLE.dims] == [d.name for d in SOFTMAX.dims]


# -- bad inputs -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("inputs", "field"),
    [
        ((torch.ones(4, 5),), "inputs"),
        ((torch.tensor(1.0), torch.tensor(1.0)), "inputs.y"),
        ((torch.ones(4, 5), torch.ones(4, 6)), "inputs.grad"),
        ((torch.ones(4, 5), torch.ones(20)), "inputs.grad"),
    ],
)
def test_bad_inputs_are_a_shape_error_naming_the_input(inputs: tuple[torch.Tensor, ...], field: str) -> None:
    for spec in (PORTABLE, NATIVE, TRITON):
        with pytest.raises(ShapeError) as caught:
            spec.shape_of(inputs)
        assert caught.value.field == field
