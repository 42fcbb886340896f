"""matmul's operand layouts: a transposed A or B (the ``.t()`` of a row-major matrix) is read in place.

Every implementation here (portable ``torch``, ``native``, Triton in its interpreter) gives the
reference for the four layouts; ``shape_of`` reports them as ``a_transposed`` / ``b_transposed``;
operands of other strides are made contiguous; the operator on ``x @ w.t()`` copies no ``w``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import tiletune.kernels.ops  # noqa: F401  (registers torch.ops.tiletune.*)
from tests.kernels.cases import one_tensor
from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.matmul.portable import layout
from tiletune.kernels.native.build import native_module, native_status
from tiletune.kernels.registry import builtin_kernels
from tiletune.kernels.spec import KernelSpec, dtype_name
from tiletune.kernels.triton.spec import triton_installed

from .cases import CPU

KERNELS = builtin_kernels()
MATMULS = ("matmul", "native_matmul", "triton_matmul")
#: Each implementation and a config whose tiles divide none of ``SHAPE``'s dims.
IMPLEMENTATIONS: dict[str, tuple[str, Config]] = {
    "matmul": ("torch", {"tile_m": 16, "tile_n": 32, "tile_k": 32, "buffer_num": 2, "pipeline_depth": 2}),
    "native_matmul": (
        "native",
        {"tile_m": 16, "tile_n": 32, "tile_k": 32, "buffer_num": 2, "pipeline_depth": 2, "block_dim": 3},
    ),
    "triton_matmul": (
        "triton",
        {"block_m": 16, "block_n": 32, "block_k": 16, "num_stages": 2, "num_warps": 4},
    ),
}
#: Triton's interpreter computes ``tl.dot`` of bfloat16 blocks wrongly (garbage of 1e10, with the
#: row-major kernel too), so the interpreted Triton kernel takes float16 as its low precision.
INTERPRETED_DTYPE = {"bfloat16": "float16"}
SIZES = {"m": 37, "n": 50, "k": 70}
LAYOUTS = [(0, 0), (1, 0), (0, 1), (1, 1)]


def available(kernel: str) -> None:
    """Fail when the native extension is not built (it is part of the product on CPUs, as in
    test_native.py); skip Triton where it is not installed."""
    if kernel == "native_matmul" and not native_status().available:
        pytest.fail(f"the native CPU backend is unavailable: {native_status().reason}")
    if kernel == "triton_matmul" and not triton_installed():
        pytest.skip("triton is not installed (tiletune[triton])")


def assert_reference(spec: KernelSpec, inputs: Sequence[torch.Tensor], shape: Shape) -> None:
    """The kernel's result on ``inputs`` (its config of :data:`IMPLEMENTATIONS`) is the reference's."""
    backend, config = IMPLEMENTATIONS[spec.name]
    actual = one_tensor(spec.run(inputs, config, shape, backend))
    expected = one_tensor(spec.reference(inputs, shape))
    tolerance = spec.tolerance(dtype_name(inputs[0].dtype))
    assert actual.dtype == inputs[0].dtype
    assert actual.shape == (shape["m"], shape["n"])
    torch.testing.assert_close(actual.float(), expected.float(), atol=tolerance.atol, rtol=tolerance.rtol)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(("a_t", "b_t"), LAYOUTS)
@pytest.mark.parametrize("kernel", MATMULS)
def test_every_layout_matches_the_reference(kernel: str, a_t: int, b_t: int, dtype: str) -> None:
    available(kernel)
    spec = KERNELS[kernel]
    if kernel == "triton_matmul":
        dtype = INTERPRETED_DTYPE.get(dtype, dtype)
    shape = spec.parse_shape({**SIZES, "a_transposed": a_t, "b_transposed": b_t})
    a, b = spec.make_inputs(shape, dtype, CPU, seed=5)
    assert (a.shape, b.shape) == ((37, 70), (70, 50))
    assert (a.t().is_contiguous(), b.t().is_contiguous()) == (bool(a_t), bool(b_t))
    assert spec.shape_of((a, b)) == shape
    assert_reference(spec, (a, b), shape)


def test_make_inputs_gives_the_same_values_in_every_layout() -> None:
    spec = KERNELS["matmul"]
    plain = spec.make_inputs(spec.parse_shape(SIZES), "float32", CPU, seed=2)
    transposed = spec.make_inputs(
        spec.parse_shape({**SIZES, "a_transposed": 1, "b_transposed": 1}), "float32", CPU, 2
    )
    for row_major, read_in_place in zip(plain, transposed, strict=True):
        assert row_major.is_contiguous()
        assert not read_in_place.is_contiguous()
        assert torch.equal(row_major, read_in_place)


def test_layout_reads_the_strides() -> None:
    x = torch.randn(6, 4)
    assert layout(x) == (x, 0)
    transposed, flag = layout(x.t())
    assert flag == 1
    assert transposed.data_ptr() == x.data_ptr()
    strided = torch.randn(6, 8)[:, ::2]
    copy, flag = layout(strided)
    assert flag == 0
    assert copy.is_contiguous()
    assert torch.equal(copy, strided)
    column = torch.randn(1, 6).t()  # [6, 1]: row-major as well, so row-major
    assert layout(column)[1] == 0


@pytest.mark.parametrize("kernel", MATMULS)
def test_an_operand_of_other_strides_is_made_contiguous(kernel: str) -> None:
    available(kernel)
    spec = KERNELS[kernel]
    generator = torch.Generator().manual_seed(7)
    a = torch.randn(37, 140, generator=generator)[:, ::2]  # [37, 70], strides (140, 2)
    b = torch.randn(50, 140, generator=generator).t()[::2]  # [70, 50], strides (2, 140)
    for operand in (a, b):
        assert not operand.is_contiguous()
        assert not operand.t().is_contiguous()
    shape = spec.shape_of((a, b))
    assert shape == {**SIZES, "a_transposed": 0, "b_transposed": 0}
    assert_reference(spec, (a, b), shape)


def test_the_native_extension_refuses_other_strides() -> None:
    available("native_matmul")
    a = torch.randn(8, 12)[:, ::2]
    with pytest.raises(RuntimeError, match="transpose of a row-major matrix"):
        native_module().matmul(a, torch.randn(6, 5), 4, 4, 4, 1, 1, 1)


def test_the_portable_kernel_runs_native_on_transposed_operands() -> None:
    available("native_matmul")
    spec = KERNELS["matmul"]
    shape = spec.parse_shape({**SIZES, "a_transposed": 1, "b_transposed": 1})
    inputs = spec.make_inputs(shape, "float32", CPU, seed=1)
    config = IMPLEMENTATIONS["matmul"][1]
    expected = spec.reference(inputs, shape)
    torch.testing.assert_close(spec.run(inputs, config, shape, "native"), expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kernel", MATMULS)
def test_a_key_without_the_layout_dims_parses_row_major(kernel: str) -> None:
    spec = KERNELS[kernel]
    assert spec.version == 2
    assert spec.parse_shape({"m": 3, "n": 4, "k": 5}) == {
        "m": 3,
        "n": 4,
        "k": 5,
        "a_transposed": 0,
        "b_transposed": 0,
    }


def copies_of(shapes: set[tuple[int, int]], call: Callable[[], object]) -> list[str]:
    """The copying ops (clone, contiguous, copy_, to) that ``call()`` runs on a tensor of ``shapes``."""
    copying = {"aten::clone", "aten::contiguous", "aten::copy_", "aten::_to_copy", "aten::to"}
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        call()
    return [
        event.name
        for event in prof.events()
        if event.name in copying and any(tuple(s) in shapes for s in event.input_shapes)
    ]


def test_the_operator_reads_a_linear_weight_in_place() -> None:
    # k = 520 exceeds every tile_k, so no tile of the portable kernel is the whole weight either.
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(8, 520, generator=generator)
    w = torch.randn(24, 520, generator=generator)  # a Linear weight [out, in]
    weight_shapes = {(520, 24), (24, 520)}
    result: list[torch.Tensor] = []
    assert copies_of(weight_shapes, lambda: result.append(torch.ops.tiletune.matmul(x, w.t()))) == []
    torch.testing.assert_close(result[0], x @ w.t(), atol=1e-4, rtol=1e-4)
    # The check sees a copy where there is one: a weight of other strides is made contiguous.
    strided = torch.randn(48, 520, generator=generator)[::2]
    copied = copies_of(weight_shapes, lambda: result.append(torch.ops.tiletune.matmul(x, strided.t())))
    assert "aten::clone" in copied
    torch.testing.assert_close(result[1], x @ strided.t(), atol=1e-4, rtol=1e-4)
