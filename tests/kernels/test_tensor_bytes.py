"""The bytes each kernel declares for its tensors, and the shape bound built on them.

A shape is a key when each tensor of a call holds at most ``MAX_TENSOR_BYTES`` (counted in the
widest dtype), not when the product of all its dims is small: a matmul's ``k`` or an
attention's heads are never allocated together. The declarations are checked against the
tensors a small call really makes; the big shapes are only counted, never allocated.
"""

from __future__ import annotations

import pytest

from tests.kernels.cases import TILED_FAMILIES
from tests.kernels.test_launch import ScaleSpec, load_gelu_plugin
from tiletune.client.wire import MAX_DIM
from tiletune.kernels.declaration import MAX_TENSOR_BYTES, WIDEST_DTYPE, Shape, format_bytes
from tiletune.kernels.device import cpu_chip
from tiletune.kernels.errors import ShapeError
from tiletune.kernels.fused_attention import portable as fused_attention
from tiletune.kernels.fused_attention.portable import FusedAttentionSpec
from tiletune.kernels.registry import all_kernels, builtin_kernels
from tiletune.kernels.spec import KernelSpec

from .cases import CPU, SHAPES

KERNELS = builtin_kernels()
LIMITS = cpu_chip().limits

MATMUL_4096 = {"m": 4096, "n": 4096, "k": 4096, "a_transposed": 0, "b_transposed": 1}
#: Grouped-query attention as in an 8B model's prefill: 32 query heads share 8 kv heads.
ATTENTION_4096 = {
    "batch": 1,
    "heads": 32,
    "kv_heads": 8,
    "seq_q": 4096,
    "seq_kv": 4096,
    "head_dim": 128,
    "causal": 2,
    "mask": 0,
}
#: ``out`` would be 2^40 elements: 4 TiB in float32.
MATMUL_TOO_BIG = {"m": 2**20, "n": 2**20, "k": 16, "a_transposed": 0, "b_transposed": 0}
#: ``q`` would be 2^40 elements: 4 TiB in float32.
ATTENTION_TOO_BIG = {
    "batch": 64,
    "heads": 128,
    "kv_heads": 128,
    "seq_q": 131072,
    "seq_kv": 1,
    "head_dim": 1024,
    "causal": 0,
    "mask": 0,
}


def test_the_widest_dtype_is_float32_and_the_limit_is_one_tebibyte() -> None:
    assert WIDEST_DTYPE == "float32"
    assert MAX_TENSOR_BYTES == 2**40
    assert format_bytes(MAX_TENSOR_BYTES) == "1.0 TiB"
    assert format_bytes(512) == "512 B"
    assert format_bytes(1.5 * 2**30) == "1.5 GiB"


@pytest.mark.parametrize(("name", "shape"), [("matmul", MATMUL_4096), ("fused_attention", ATTENTION_4096)])
def test_common_llm_shapes_are_keys(name: str, shape: Shape) -> None:
    assert KERNELS[name].parse_shape(shape) == shape


@pytest.mark.parametrize(
    ("name", "shape", "tensor"),
    [("matmul", MATMUL_TOO_BIG, "out"), ("fused_attention", ATTENTION_TOO_BIG, "q")],
)
def test_a_shape_whose_tensor_exceeds_the_limit_is_refused_naming_the_tensor(
    name: str, shape: Shape, tensor: str
) -> None:
    with pytest.raises(ShapeError) as caught:
        KERNELS[name].parse_shape(shape)
    assert caught.value.field == "shape"
    assert f"tensor {tensor} would hold 4.0 TiB ({4 * 2**40} bytes in float32" in caught.value.reason
    assert "at most 1.0 TiB per tensor" in caught.value.reason


def test_the_limit_is_on_each_tensor_inclusive() -> None:
    matmul = KERNELS["matmul"]
    at_limit = {
        "m": 2**19,
        "n": 2**19,
        "k": 1,
        "a_transposed": 0,
        "b_transposed": 0,
    }  # out: 2^38 float32 elements, exactly 1 TiB
    assert matmul.tensor_bytes(at_limit, WIDEST_DTYPE)["out"] == MAX_TENSOR_BYTES
    assert matmul.parse_shape(at_limit) == at_limit
    with pytest.raises(ShapeError, match="tensor out"):
        matmul.parse_shape({**at_limit, "m": 2**19 + 1})


def test_the_bound_does_not_depend_on_the_dtype() -> None:
    """Counted in the widest dtype: a float16 out of 2 TiB is refused as a float32 one of 4 TiB would be."""
    matmul = KERNELS["matmul"]
    assert matmul.tensor_bytes(MATMUL_TOO_BIG, "float16")["out"] == 2 * 2**40
    with pytest.raises(ShapeError, match="in float32"):
        matmul.parse_shape(MATMUL_TOO_BIG)


def test_a_dim_beyond_what_the_database_holds_is_refused_naming_the_dim() -> None:
    with pytest.raises(ShapeError) as caught:
        KERNELS["softmax"].parse_shape({"rows": 1, "cols": MAX_DIM + 1})
    assert caught.value.field == "shape.cols"
    assert "at most" in caught.value.reason


def reference_bytes(spec: KernelSpec, shape: Shape, dtype: str) -> tuple[list[int], int]:
    """The bytes of a real call's inputs and outputs (sorted: ``fused_attention`` gives its output
    and log-sum-exp, a backward kernel its gradients), and of the reference's results."""
    inputs = spec.make_inputs(shape, dtype, CPU)
    config = spec.default_config(shape, dtype, LIMITS)
    result = (
        spec.attend(inputs, config, shape)
        if isinstance(spec, FusedAttentionSpec)
        else spec.run(inputs, config, shape)
    )
    outputs = result if isinstance(result, tuple) else (result,)  # a backward kernel gives several
    call = sorted([t.nbytes for t in inputs] + [t.nbytes for t in outputs])
    expected = spec.reference(inputs, shape)
    return call, sum(t.nbytes for t in (expected if isinstance(expected, tuple) else (expected,)))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("name", TILED_FAMILIES)
def test_declared_tensors_are_the_tensors_of_a_call(name: str, dtype: str) -> None:
    spec = KERNELS[name]
    shape = SHAPES[name][1]
    call, reference = reference_bytes(spec, shape, dtype)
    assert sorted(spec.tensor_bytes(shape, dtype).values()) == call
    assert spec.workspace_bytes(shape, dtype)["reference"] == reference


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_attention_declares_grouped_kv_and_the_mask_at_its_largest(dtype: str) -> None:
    """k and v at ``kv_heads``; the mask counted as ``[batch, heads, seq_q, seq_kv]`` (the largest a
    call may pass: the one made here broadcasts over heads, and is no larger)."""
    spec = fused_attention.SPEC
    shape = next(s for s in SHAPES["fused_attention"] if s["mask"] and s["kv_heads"] < s["heads"])
    declared = spec.tensor_bytes(shape, dtype)
    q, k, v, mask = inputs = spec.make_inputs(shape, dtype, CPU)
    out, lse = spec.attend(inputs, spec.default_config(shape, dtype, LIMITS), shape)
    made = {"q": q, "k": k, "v": v, "out": out, "lse": lse}
    assert {name: size for name, size in declared.items() if name != "mask"} == {
        name: t.nbytes for name, t in made.items()
    }
    b, h, sq, skv = (shape[n] for n in ("batch", "heads", "seq_q", "seq_kv"))
    assert declared["mask"] == mask.new_empty(b, h, sq, skv).nbytes >= mask.nbytes
    assert "mask" not in spec.tensor_bytes({**shape, "mask": 0}, dtype)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_the_example_plugin_declares_its_tensors(dtype: str) -> None:
    gelu = load_gelu_plugin().SPEC
    shape = {"n": 1000}
    inputs = gelu.make_inputs(shape, dtype, CPU)
    output = gelu.run(inputs, {"tile_size": 256}, shape)
    assert gelu.tensor_bytes(shape, dtype) == {"x": inputs[0].nbytes, "out": output.nbytes}
    assert gelu.workspace_bytes(shape, dtype)["reference"] == gelu.reference(inputs, shape).nbytes


def test_a_spec_that_declares_no_tensors_is_counted_from_bytes_moved() -> None:
    plugin = ScaleSpec()
    assert plugin.tensor_bytes({"n": 1000}, "float16") == {"inputs_and_output": 4000}
    assert plugin.workspace_bytes({"n": 1000}, "float16") == {"reference": 8000}
    assert plugin.allocated_bytes({"n": 1000}, "float16") == 12000.0
    too_big = {"n": MAX_TENSOR_BYTES // 8 + 1}  # 2n float32 bytes: just over the limit
    with pytest.raises(ShapeError, match="tensor inputs_and_output would hold"):
        plugin.parse_shape(too_big)


@pytest.mark.parametrize("name", sorted(all_kernels()))
def test_allocated_bytes_is_the_sum_of_every_tensor_a_bench_holds(name: str) -> None:
    spec = all_kernels()[name]
    shape = {dim.name: dim.choices[-1] if dim.choices else 48 for dim in spec.dims}
    for dtype in ("float32", "float16"):
        tensors = spec.bench_bytes(shape, dtype)
        assert all(isinstance(size, int) and size >= 0 for size in tensors.values())
        assert spec.allocated_bytes(shape, dtype) == float(sum(tensors.values()))
