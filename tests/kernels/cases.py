"""What the kernel tests share: shapes the tiles do not divide, bounds of random shapes, the check."""

from __future__ import annotations

import math

import torch

from tiletune.kernels.declaration import Shape
from tiletune.kernels.family import builtin_families
from tiletune.kernels.native.space import NATIVE_BACKEND
from tiletune.kernels.spec import KernelOutput, KernelSpec
from tiletune.kernels.triton.space import TRITON_BACKEND

CPU = torch.device("cpu")

#: The built-in families with tiled implementations (the portable pipeline, native C++, Triton),
#: by their own kernels' names.
TILED_FAMILIES = tuple(name for name, f in builtin_families().items() if f.implementation(TRITON_BACKEND))


def implementation_of(family: str, backend: str) -> str:
    """The kernel name of the built-in ``family``'s implementation ``backend``."""
    implementation = builtin_families()[family].implementation(backend)
    assert implementation is not None, (family, backend)
    return implementation.kernel


#: Each tiled family's Triton and native kernels, in the families' order.
TRITON_KERNELS = tuple(implementation_of(family, TRITON_BACKEND) for family in TILED_FAMILIES)
NATIVE_KERNELS = tuple(implementation_of(family, NATIVE_BACKEND) for family in TILED_FAMILIES)

#: Shapes per portable kernel that no tile divides evenly (and a few that some tiles do).
SHAPES: dict[str, list[Shape]] = {
    "add": [{"n": 1}, {"n": 1000}, {"n": 4099}],
    "softmax": [{"rows": 1, "cols": 1}, {"rows": 37, "cols": 300}, {"rows": 5, "cols": 1000}],
    "softmax_backward": [{"rows": 1, "cols": 1}, {"rows": 37, "cols": 300}, {"rows": 5, "cols": 1000}],
    "rms_norm": [{"rows": 3, "cols": 7}, {"rows": 37, "cols": 300}, {"rows": 6, "cols": 1000}],
    "rms_norm_backward": [{"rows": 1, "cols": 1}, {"rows": 37, "cols": 300}, {"rows": 6, "cols": 1000}],
    "matmul": [{"m": 1, "n": 1, "k": 1}, {"m": 37, "n": 100, "k": 300}, {"m": 64, "n": 64, "k": 64}],
    "fused_attention": [
        {
            "batch": 1,
            "heads": 1,
            "kv_heads": 1,
            "seq_q": 1,
            "seq_kv": 1,
            "head_dim": 4,
            "causal": 1,
            "mask": 0,
        },
        {
            "batch": 2,
            "heads": 3,
            "kv_heads": 3,
            "seq_q": 37,
            "seq_kv": 50,
            "head_dim": 16,
            "causal": 1,
            "mask": 0,
        },
        {
            "batch": 1,
            "heads": 2,
            "kv_heads": 2,
            "seq_q": 100,
            "seq_kv": 33,
            "head_dim": 8,
            "causal": 1,
            "mask": 0,
        },
        {
            "batch": 1,
            "heads": 2,
            "kv_heads": 1,
            "seq_q": 70,
            "seq_kv": 130,
            "head_dim": 32,
            "causal": 0,
            "mask": 1,
        },
        {
            "batch": 2,
            "heads": 4,
            "kv_heads": 2,
            "seq_q": 45,
            "seq_kv": 30,
            "head_dim": 8,
            "causal": 2,
            "mask": 1,
        },
    ],
    "fused_attention_backward": [
        {
            "batch": 1,
            "heads": 1,
            "kv_heads": 1,
            "seq_q": 1,
            "seq_kv": 1,
            "head_dim": 4,
            "causal": 1,
            "mask": 0,
        },
        {
            "batch": 2,
            "heads": 3,
            "kv_heads": 3,
            "seq_q": 37,
            "seq_kv": 50,
            "head_dim": 16,
            "causal": 1,
            "mask": 0,
        },
        {
            "batch": 1,
            "heads": 2,
            "kv_heads": 2,
            "seq_q": 100,
            "seq_kv": 33,
            "head_dim": 8,
            "causal": 2,
            "mask": 0,
        },
        {
            "batch": 1,
            "heads": 2,
            "kv_heads": 1,
            "seq_q": 70,
            "seq_kv": 130,
            "head_dim": 32,
            "causal": 0,
            "mask": 1,
        },
        {
            "batch": 2,
            "heads": 4,
            "kv_heads": 2,
            "seq_q": 45,
            "seq_kv": 30,
            "head_dim": 8,
            "causal": 2,
            "mask": 1,
        },
    ],
}
#: Upper bounds of each dim for random shapes in the property tests.
DIM_BOUNDS: dict[str, dict[str, int]] = {
    "add": {"n": 5000},
    "softmax": {"rows": 40, "cols": 300},
    "softmax_backward": {"rows": 40, "cols": 300},
    "rms_norm": {"rows": 40, "cols": 300},
    "rms_norm_backward": {"rows": 40, "cols": 300},
    "matmul": {"m": 80, "n": 80, "k": 200},
    "fused_attention": {"batch": 2, "heads": 4, "kv_heads": 4, "seq_q": 80, "seq_kv": 80, "head_dim": 16},
    "fused_attention_backward": {
        "batch": 2,
        "heads": 4,
        "kv_heads": 4,
        "seq_q": 80,
        "seq_kv": 80,
        "head_dim": 16,
    },
}


def one_tensor(output: KernelOutput) -> torch.Tensor:
    """A forward kernel's output: one tensor (a backward kernel's gradients fail the test)."""
    assert isinstance(output, torch.Tensor), f"expected one tensor, got {len(output)}"
    return output


def with_grouping(shape: Shape) -> Shape:
    """A random shape made valid: ``kv_heads`` (drawn freely) becomes a divisor of ``heads``."""
    if "kv_heads" in shape:
        return {**shape, "kv_heads": math.gcd(shape["kv_heads"], shape["heads"])}
    return shape


def assert_matches_reference(
    spec: KernelSpec,
    shape: Shape,
    dtype: str,
    configs: list[dict[str, int]],
    *,
    backend: str = "torch",
    seed: int = 3,
) -> None:
    """Each config's output on ``backend`` is the reference's, within the dtype's tolerance (each of a
    backward kernel's gradients against the reference's, in order)."""
    inputs = spec.make_inputs(shape, dtype, CPU, seed=seed)
    reference = spec.reference(inputs, shape)
    tolerance = spec.tolerance(dtype)
    for config in configs:
        output = (
            spec.run(inputs, config, shape) if backend is None else spec.run(inputs, config, shape, backend)
        )
        outputs = output if isinstance(output, tuple) else (output,)
        references = reference if isinstance(reference, tuple) else (reference,)
        assert len(outputs) == len(references), config
        for index, (actual, expected) in enumerate(zip(outputs, references, strict=True)):
            assert actual.dtype == inputs[0].dtype, config
            assert actual.shape == expected.shape, (index, config)
            try:
                torch.testing.assert_close(actual.float(), expected, atol=tolerance.atol, rtol=tolerance.rtol)
            except AssertionError as error:
                raise AssertionError(f"{spec.name} {shape} {dtype} {config} #{index}: {error}") from None
