"""``rms_norm_backward`` (portable, native, Triton in its interpreter) against torch's autograd of the
forward: ``torch.autograd.grad(functional.rms_norm(x, (cols,), w, EPS), (x, w), grad)`` in float64.

The kernels return ``(dx, dw)``. Float32 runs are held tightly to the float64 gradients; float16 and
bfloat16 runs to the tolerances below (the inputs are rounded to the dtype before torch's float64
gradient is taken, so what remains is the kernels' float32 arithmetic and the rounding of their
outputs; ``dw`` sums ``rows`` terms, hence its looser bound). Shapes include ones no tile divides,
leading dims, whole-row and column tiles, and every ``buffer_num`` / ``pipeline_depth``. The native
extension is part of the product on CPUs: when it is not built its tests fail with the reason.

``eps`` is a call argument of the family (``run_with``, ``reference_with``, ``vendor_with``): every
implementation, forward and backward, computes at the call's against torch's ``F.rms_norm`` there.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.nn import functional

from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.device import cpu_chip
from tiletune.kernels.errors import ShapeError
from tiletune.kernels.native.build import native_status
from tiletune.kernels.pipeline import tracing
from tiletune.kernels.rms_norm import native as forward_native
from tiletune.kernels.rms_norm import portable as forward_portable
from tiletune.kernels.rms_norm import triton as forward_triton
from tiletune.kernels.rms_norm.declaration import EPS
from tiletune.kernels.rms_norm_backward.native import SPEC as NATIVE
from tiletune.kernels.rms_norm_backward.portable import SPEC as PORTABLE
from tiletune.kernels.rms_norm_backward.triton import SPEC as TRITON
from tiletune.kernels.spec import KernelSpec
from tiletune.kernels.triton.spec import INTERPRET_ENV, triton_installed

LIMITS = cpu_chip().limits
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
#: (atol, rtol) against the float64 gradients, for dx and for dw.
TOLERANCE = {
    "float32": ((1e-5, 1e-5), (1e-5, 1e-5)),
    "float16": ((4e-3, 4e-3), (1e-2, 4e-3)),
    "bfloat16": ((3e-2, 1.6e-2), (8e-2, 1.6e-2)),
}
#: Leading dims and rows x cols: 1 x 1, no tile divides 37 x 300 or 6 x 1000, batched 3 x 4 x 50.
SIZES = ((1, 1), (37, 300), (6, 1000), (3, 4, 50))
#: (tile_rows, tile_cols): whole rows (one pass) and column tiles (two passes) over SIZES.
TILES = ((1, 1024), (16, 1024), (4, 32), (8, 128), (2, 64))
#: The kernels' outputs, in order.
GRADIENTS = ("dx", "dw")
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
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, torch.Tensor], Shape]:
    """``(x, w, grad)`` in ``dtype``, torch's float64 ``(dx, dw)`` of ``F.rms_norm`` at them, the shape."""
    generator = torch.Generator().manual_seed(seed)
    cols = sizes[-1]
    made = (
        torch.randn(sizes, generator=generator, dtype=torch.float64),
        torch.rand(cols, generator=generator, dtype=torch.float64) + 0.5,
        torch.randn(sizes, generator=generator, dtype=torch.float64),
    )
    inputs = tuple(t.to(DTYPES[dtype]) for t in made)
    x, w = (t.double().requires_grad_() for t in inputs[:2])
    dx, dw = torch.autograd.grad(functional.rms_norm(x, (cols,), w, EPS), (x, w), inputs[2].double())
    return inputs, (dx, dw), PORTABLE.shape_of(inputs)


def check(spec: KernelSpec, sizes: tuple[int, ...], dtype: str, configs: list[Config], backend: str) -> None:
    """Each config's ``(dx, dw)`` on ``backend`` is torch's within ``dtype``'s tolerance."""
    inputs, expected, shape = autograd_case(sizes, dtype)
    for config in configs:
        output = spec.run(inputs, config, shape, backend)
        assert isinstance(output, tuple)
        assert len(output) == 2
        for name, got, want, (atol, rtol) in zip(GRADIENTS, output, expected, TOLERANCE[dtype], strict=True):
            assert got.dtype == DTYPES[dtype], (name, config)
            assert got.shape == want.shape, (name, config)
            try:
                torch.testing.assert_close(got.double(), want, atol=atol, rtol=rtol)
            except AssertionError as error:
                raise AssertionError(f"{name} {sizes} {dtype} {config}: {error}") from None


def row_configs(sizes: tuple[int, ...], block_dim: int | None = None) -> list[Config]:
    """Every (tile, pipeline) pair of TILES x PIPELINES, tiles clamped to ``sizes``."""
    rows, cols = max(1, torch.Size(sizes[:-1]).numel()), sizes[-1]
    configs = []
    for (tile_rows, tile_cols), (buffers, depth) in itertools.product(TILES, PIPELINES):
        config = {"tile_rows": min(tile_rows, rows), "tile_cols": min(tile_cols, cols)}
        if block_dim is not None:
            config["block_dim"] = min(block_dim, -(-rows // config["tile_rows"]))
        configs.append({**config, "buffer_num": buffers, "pipeline_depth": depth})
    return configs


@pytest.mark.parametrize("sizes", SIZES)
def test_portable_matches_autograd_for_every_tile_and_pipeline(sizes: tuple[int, ...]) -> None:
    check(PORTABLE, sizes, "float32", row_configs(sizes), "torch")


@pytest.mark.usefixtures("native_built")
@pytest.mark.parametrize("sizes", SIZES)
def test_native_matches_autograd_for_every_tile_pipeline_and_cores(sizes: tuple[int, ...]) -> None:
    configs = row_configs(sizes, block_dim=1) + row_configs(sizes, block_dim=2)
    check(NATIVE, sizes, "float32", configs, "native")


@pytest.mark.usefixtures("native_built")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize(("spec", "backend"), [(PORTABLE, "torch"), (NATIVE, "native")])
def test_half_types_match_autograd_within_their_tolerance(spec: KernelSpec, backend: str, dtype: str) -> None:
    for sizes in SIZES:
        configs = row_configs(sizes, block_dim=2 if backend == "native" else None)[::5]
        check(spec, sizes, dtype, configs, backend)


@st.composite
def sized_config(draw: st.DrawFn, spec: KernelSpec) -> tuple[tuple[int, ...], Config]:
    """Random rows x cols (up to 40 x 300) and a valid config of ``spec`` for them."""
    sizes = (draw(st.integers(1, 40)), draw(st.integers(1, 300)))
    space = spec.space({"rows": sizes[0], "cols": sizes[1]}, "float32", LIMITS)
    return sizes, draw(st.sampled_from(space))


@pytest.mark.usefixtures("native_built")
@pytest.mark.parametrize(("spec", "backend"), [(PORTABLE, "torch"), (NATIVE, "native")])
def test_random_shapes_and_valid_configs_match_autograd(spec: KernelSpec, backend: str) -> None:
    @settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
    @given(case=sized_config(spec))
    def run(case: tuple[tuple[int, ...], Config]) -> None:
        sizes, config = case
        check(spec, sizes, "float32", [config], backend)

    run()


#: Triton configs over SIZES' 37 x 300: one pass, and two passes with every num_stages.
TRITON_CONFIGS = [
    {"block_rows": 8, "block_cols": 512, "num_stages": 1, "num_warps": 4},
    {"block_rows": 1, "block_cols": 512, "num_stages": 1, "num_warps": 1},
    *({"block_rows": 4, "block_cols": 64, "num_stages": s, "num_warps": 2} for s in (1, 2, 3, 4)),
    {"block_rows": 64, "block_cols": 128, "num_stages": 2, "num_warps": 8},
]


@needs_triton
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_triton_matches_autograd_in_the_interpreter(dtype: str) -> None:
    check(TRITON, (37, 300), dtype, TRITON_CONFIGS, "triton")
    smallest = {"block_rows": 1, "block_cols": 16, "num_stages": 1, "num_warps": 1}
    check(TRITON, (1, 1), dtype, [smallest], "triton")
    batched = [{"block_rows": 4, "block_cols": 64, "num_stages": 1, "num_warps": 4}]
    check(TRITON, (3, 4, 50), dtype, [*batched, {**batched[0], "block_cols": 16, "num_stages": 2}], "triton")


@pytest.mark.usefixtures("native_built")
def test_dw_is_the_same_bits_for_a_config_and_close_across_configs() -> None:
    """Partial sums per core (native) or per step (portable), added in a fixed order."""
    inputs, _, shape = autograd_case((64, 200), "float32", seed=4)
    base = {"tile_rows": 4, "tile_cols": 64, "buffer_num": 2, "pipeline_depth": 2}
    for spec, backend, config in ((PORTABLE, "torch", base), (NATIVE, "native", {**base, "block_dim": 2})):
        first, again = (spec.run(inputs, config, shape, backend) for _ in range(2))
        assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True)), backend
    one_core = NATIVE.run(inputs, {**base, "block_dim": 1}, shape)
    torch.testing.assert_close(one_core, NATIVE.run(inputs, {**base, "block_dim": 2}, shape))


@pytest.mark.parametrize(("tile_cols", "steps_per_row_tile"), [(200, 1), (64, 8), (32, 14)])
def test_column_tiles_take_two_passes_and_whole_rows_one(tile_cols: int, steps_per_row_tile: int) -> None:
    """Each step copies x, grad (and w's slice) in again; a pass over a row's column tiles per
    statistic and per output, as the declaration says."""
    inputs, _, shape = autograd_case((10, 200), "float32")
    config = {"tile_rows": 4, "tile_cols": tile_cols, "buffer_num": 3, "pipeline_depth": 3}
    with tracing() as trace:
        PORTABLE.run(inputs, config, shape)
    assert len(trace.of("compute")) == 3 * steps_per_row_tile  # 3 row tiles: 4 + 4 + 2 rows
    outputs_per_row_tile = max(1, steps_per_row_tile // 2)  # the second pass's column tiles
    assert len(trace.of("copy_out")) == 3 * outputs_per_row_tile
    assert {event.slot for event in trace.of("copy_in")} == {0, 1, 2}  # buffer_num slots in turn


@pytest.mark.parametrize(
    ("inputs", "field", "words"),
    [
        ((torch.ones(3, 5), torch.ones(4), torch.ones(3, 5)), "inputs.w", "its length is 4, expected 5"),
        ((torch.ones(3, 5), torch.ones(1, 5), torch.ones(3, 5)), "inputs.w", "a vector of cols weights"),
        ((torch.ones(3, 5), torch.ones(5), torch.ones(5, 3)), "inputs.grad", "must have x's size [3, 5]"),
        ((torch.ones(3, 5), torch.ones(5)), "inputs", "takes 3 tensor(s) (x, w, grad), got 2"),
        ((torch.tensor(1.0), torch.ones(1), torch.tensor(1.0)), "inputs.x", "at least one dim"),
    ],
)
def test_bad_inputs_name_the_input(inputs: tuple[torch.Tensor, ...], field: str, words: str) -> None:
    for spec in (PORTABLE, NATIVE, TRITON):
        with pytest.raises(ShapeError) as caught:
            spec.shape_of(inputs)
        assert caught.value.field == field
        assert words in caught.value.reason


def test_the_reference_is_the_formula_in_float32_and_float64() -> None:
    inputs, expected, shape = autograd_case((37, 300), "float32", seed=2)
    dx, dw = PORTABLE.reference(inputs, shape)
    assert (dx.dtype, dw.dtype) == (torch.float32, torch.float32)
    torch.testing.assert_close(dx.double(), expected[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dw.double(), expected[1], atol=1e-5, rtol=1e-5)
    wide = PORTABLE.reference(tuple(t.double() for t in inputs), shape)
    assert all(t.dtype == torch.float64 for t in wide)
    for got, want in zip(wide, expected, strict=True):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-10)


# -- eps, the call argument ----------------------------------------------------------------------

#: eps other than the default: a Hugging Face checkpoint's, float32's machine epsilon (``torch.nn.RMSNorm``'s
#: default), a large one.
OTHER_EPS = (1e-5, torch.finfo(torch.float32).eps, 0.1)
#: Each implementation's forward and backward specs, and configs over 37 x 300: whole rows and column tiles.
IMPLEMENTATIONS: dict[str, tuple[KernelSpec, KernelSpec, list[Config]]] = {
    "torch": (
        forward_portable.SPEC,
        PORTABLE,
        [
            {"tile_rows": 8, "tile_cols": 300, "buffer_num": 2, "pipeline_depth": 2},
            {"tile_rows": 4, "tile_cols": 64, "buffer_num": 3, "pipeline_depth": 3},
        ],
    ),
    "native": (
        forward_native.SPEC,
        NATIVE,
        [
            {"tile_rows": 8, "tile_cols": 300, "block_dim": 2, "buffer_num": 2, "pipeline_depth": 2},
            {"tile_rows": 4, "tile_cols": 64, "block_dim": 2, "buffer_num": 1, "pipeline_depth": 1},
        ],
    ),
    "triton": (
        forward_triton.SPEC,
        TRITON,
        [
            {"block_rows": 8, "block_cols": 512, "num_stages": 1, "num_warps": 4},
            {"block_rows": 4, "block_cols": 64, "num_stages": 2, "num_warps": 2},
        ],
    ),
}


def small_case(eps: float) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...], Shape]:
    """``(x, w, grad)`` in float32 with ``x`` of magnitude 1e-3 (``mean(x^2)`` about 1e-6, so that
    ``eps`` moves the result), and torch's float64 ``(y, dx, dw)`` of ``F.rms_norm`` at ``eps``."""
    (x, w, grad), _, shape = autograd_case((37, 300), "float32", seed=5)
    x = x * 1e-3
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    y = functional.rms_norm(x64, (300,), w64, eps)
    dx, dw = torch.autograd.grad(y, (x64, w64), grad.double())
    return (x, w, grad), (y.detach(), dx, dw), shape


def assert_close_at_scale(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """float32 ``got`` is float64 ``want`` within 1e-5 of its largest magnitude (at least 1)."""
    scale = max(1.0, float(want.abs().max()))
    torch.testing.assert_close(got.double(), want, atol=1e-5 * scale, rtol=1e-5, msg=what)


def one_output(output: object) -> torch.Tensor:
    """A forward's output: one tensor."""
    assert isinstance(output, torch.Tensor)
    return output


@pytest.mark.usefixtures("native_built")
@pytest.mark.parametrize("eps", OTHER_EPS)
@pytest.mark.parametrize("backend", ["torch", "native", pytest.param("triton", marks=needs_triton)])
def test_every_implementation_computes_at_the_calls_eps(backend: str, eps: float) -> None:
    forward, backward, configs = IMPLEMENTATIONS[backend]
    (x, w, grad), (y, dx, dw), shape = small_case(eps)
    arguments = {"eps": eps}
    for config in configs:
        out = forward.run_with((x, w), config, shape, backend, arguments)
        assert isinstance(out, torch.Tensor)
        assert_close_at_scale(out, y, f"y {config}")
        gradients = backward.run_with((x, w, grad), config, shape, backend, arguments)
        for name, got, want in zip(GRADIENTS, gradients, (dx, dw), strict=True):
            assert_close_at_scale(got, want, f"{name} {config}")
    at_default = forward.run((x, w), configs[0], shape, backend)
    assert isinstance(at_default, torch.Tensor)
    assert not torch.allclose(at_default.double(), y, rtol=1e-3), "the case does not tell eps apart"


@pytest.mark.parametrize("eps", OTHER_EPS)
def test_the_reference_and_torchs_op_compute_at_the_calls_eps(eps: float) -> None:
    (x, w, grad), (y, dx, dw), shape = small_case(eps)
    arguments = {"eps": eps}
    forward = forward_portable.SPEC
    assert_close_at_scale(one_output(forward.reference_with((x, w), shape, arguments)), y, "reference")
    vendor_op = forward.vendor_with(shape, "cpu", arguments)
    assert vendor_op is not None
    assert_close_at_scale(one_output(vendor_op((x, w))), y, "torch's op")
    backward_op = PORTABLE.vendor_with(shape, "cpu", arguments)
    assert backward_op is not None
    for got_gradients in (PORTABLE.reference_with((x, w, grad), shape, arguments), backward_op((x, w, grad))):
        for name, got, want in zip(GRADIENTS, got_gradients, (dx, dw), strict=True):
            assert_close_at_scale(got, want, name)
    wide = forward.reference_with((x.double(), w.double()), shape, arguments)
    torch.testing.assert_close(wide, y, atol=1e-12, rtol=1e-10)


def test_a_call_argument_the_kernel_does_not_take_is_a_type_error() -> None:
    (x, w, grad), _, shape = small_case(1e-5)
    config = IMPLEMENTATIONS["torch"][2][0]
    with pytest.raises(TypeError, match="rms_norm takes no call argument scale"):
        forward_portable.SPEC.run_with((x, w), config, shape, "torch", {"scale": 2.0})
    with pytest.raises(TypeError, match="rms_norm_backward takes no call argument scale"):
        PORTABLE.reference_with((x, w, grad), shape, {"scale": 2.0})
