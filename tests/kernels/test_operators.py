"""``torch.ops.tiletune.*``: opcheck, gradients (gradcheck, and against torch's own ops), the config
source asked per call, and ``torch.compile`` with no graph break, forward and backward; ``rms_norm``
at any ``eps`` (its call argument, not part of its key)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import pytest
import torch
from torch import Tensor
from torch._dynamo.testing import CompileCounterWithBackend
from torch.nn import functional

from tiletune.client.space import VENDOR_CONFIG
from tiletune.kernels import select_config
from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.device import cpu_chip
from tiletune.kernels.ops import OPERATORS, configure, current_source, using_source
from tiletune.kernels.ops.dispatch import run_kernel
from tiletune.kernels.ops.source import URL_ENV
from tiletune.kernels.registry import get_kernel

LIMITS = cpu_chip().limits
OPS = torch.ops.tiletune
EPS = 1e-6
#: float32 values and gradients of the operators against torch's ops, times the largest expected
#: magnitude (at least 1): measured at most 1.2e-6 (attention) and 5.5e-7 (matmul, k = 300) of it.
FLOAT32_ATOL = 1e-5
FLOAT32_RTOL = 1e-5

#: Each operator's tensors' sizes: shapes its default tiles do not divide (see the first test).
SIZES: dict[str, tuple[tuple[int, ...], ...]] = {
    "add": ((5, 601), (5, 601)),
    "softmax": ((37, 300),),
    "rms_norm": ((37, 300), (300,)),
    "matmul": ((37, 300), (300, 100)),
    "fused_attention": ((1, 2, 40, 16), (1, 2, 56, 16), (1, 2, 56, 16)),
    # grouped-query attention (4 query heads on 2 kv heads) with a mask shared by the heads
    "fused_attention-gqa-mask": ((2, 4, 40, 16), (2, 2, 56, 16), (2, 2, 56, 16), (2, 1, 40, 56)),
}
#: The shape each call of :data:`SIZES` is looked up under (attention's without ``causal``).
SHAPES: dict[str, Shape] = {
    "add": {"n": 3005},
    "softmax": {"rows": 37, "cols": 300},
    "rms_norm": {"rows": 37, "cols": 300},
    "matmul": {"m": 37, "n": 100, "k": 300, "a_transposed": 0, "b_transposed": 0},
    "fused_attention": {
        "batch": 1,
        "heads": 2,
        "kv_heads": 2,
        "seq_q": 40,
        "seq_kv": 56,
        "head_dim": 16,
        "mask": 0,
    },
    "fused_attention-gqa-mask": {
        "batch": 2,
        "heads": 4,
        "kv_heads": 2,
        "seq_q": 40,
        "seq_kv": 56,
        "head_dim": 16,
        "mask": 1,
    },
}
#: A tiled dim of each kernel and the knob that tiles it.
TILED: dict[str, tuple[str, str]] = {
    "add": ("n", "tile_size"),
    "softmax": ("cols", "tile_cols"),
    "rms_norm": ("cols", "tile_cols"),
    "matmul": ("m", "tile_m"),
    "fused_attention": ("seq_q", "block_q"),
}
#: Every call of the tests: an operator (its key in :data:`SIZES`), and for attention its ``causal``.
CALLS = [
    ("add", None),
    ("softmax", None),
    ("rms_norm", None),
    ("matmul", None),
    ("fused_attention", 0),
    ("fused_attention", 1),
    ("fused_attention", 2),
    ("fused_attention-gqa-mask", 2),
]
CALL_IDS = [
    "add", "softmax", "rms_norm", "matmul", "fused_attention", "fused_attention-causal",
    "fused_attention-bottom-right", "fused_attention-gqa-mask-bottom-right",
]  # fmt: skip


def kernel_of(call: str) -> str:
    """The kernel a call of :data:`CALLS` runs (``fused_attention-gqa-mask``: ``fused_attention``)."""
    return "fused_attention" if call.startswith("fused_attention") else call


def random_tensors(
    sizes: tuple[tuple[int, ...], ...], dtype: torch.dtype, *, seed: int = 0, grad: bool = False
) -> tuple[Tensor, ...]:
    """Standard normal tensors of ``sizes``; a vector (the RMS norm's weight) is in (0.5, 1.5) instead."""
    generator = torch.Generator().manual_seed(seed)
    tensors = []
    for size in sizes:
        tensor = torch.randn(size, generator=generator, dtype=torch.float64)
        if len(size) == 1:
            tensor = tensor.sigmoid() + 0.5
        tensors.append(tensor.to(dtype).requires_grad_(grad))
    return tuple(tensors)


def call_kwargs(causal: int | None) -> dict[str, int]:
    """The operator's keyword arguments: ``causal`` for attention."""
    return {} if causal is None else {"causal": causal}


def output(name: str, causal: int | None, tensors: tuple[Tensor, ...]) -> Tensor:
    """The operator's result (attention's output, without its log-sum-exp)."""
    result = OPERATORS[kernel_of(name)](*tensors, **call_kwargs(causal))
    out: Tensor = result[0] if isinstance(result, tuple) else result
    return out


def torch_output(name: str, causal: int | None, tensors: tuple[Tensor, ...]) -> Tensor:
    """torch's own op on the same call."""
    return TORCH_OPS[kernel_of(name)](*tensors, **call_kwargs(causal))


def torch_rms_norm(x: Tensor, weight: Tensor) -> Tensor:
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + EPS) * weight


def torch_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, *, causal: int = 0
) -> Tensor:
    """PyTorch's attention, causal by an explicit mask: query ``i`` sees keys ``j <= i`` (top-left,
    ``causal=1``) or ``j <= i + seq_kv - seq_q`` (bottom-right, ``causal=2``)."""
    seq_q, seq_kv = q.shape[-2], k.shape[-2]
    shift = seq_kv - seq_q if causal == 2 else 0
    visible = torch.ones(seq_q, seq_kv, dtype=torch.bool).tril(shift) if causal else None
    if mask is not None and visible is not None:
        mask = mask.masked_fill(~visible, float("-inf"))
    return functional.scaled_dot_product_attention(
        q, k, v, attn_mask=visible if mask is None else mask, enable_gqa=True
    )


#: torch's own op for each operator.
TORCH_OPS: dict[str, Callable[..., Tensor]] = {
    "add": torch.add,
    "softmax": lambda x: torch.softmax(x, -1),
    "rms_norm": torch_rms_norm,
    "matmul": torch.matmul,
    "fused_attention": torch_attention,
}


@dataclass(frozen=True)
class Answer:
    """What a config source returns: the config."""

    config: Mapping[str, int]


@dataclass
class RecordingSource:
    """A config source that records every ask; it answers ``configs[kernel]`` where given, else the
    kernel's default rule."""

    configs: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    asked: list[tuple[str, dict[str, int], str]] = field(default_factory=list)

    def get(self, kernel: str, shape: Mapping[str, int], /, *, dtype: str) -> Answer:
        self.asked.append((kernel, dict(shape), dtype))
        if kernel in self.configs:
            return Answer(self.configs[kernel])
        return Answer(get_kernel(kernel).default_config(dict(shape), dtype, LIMITS))


def looked_up_shape(name: str, causal: int | None) -> Shape:
    return SHAPES[name] if causal is None else {**SHAPES[name], "causal": causal}


def another_valid_config(name: str, shape: Shape) -> Config:
    """A valid config of the kernel other than its default."""
    spec = get_kernel(name)
    default = spec.default_config(shape, "float32", LIMITS)
    return next(c for c in spec.space(shape, "float32", LIMITS) if c != default)


def test_the_default_tiles_do_not_divide_the_tested_shapes() -> None:
    for name, (dim, knob) in TILED.items():
        shape = looked_up_shape(name, 0 if name == "fused_attention" else None)
        tile = get_kernel(name).default_config(shape, "float32", LIMITS)[knob]
        assert shape[dim] % tile != 0, name


# -- opcheck -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["float32", "float16"])
@pytest.mark.parametrize(("name", "causal"), CALLS, ids=CALL_IDS)
def test_opcheck_passes(name: str, causal: int | None, dtype: torch.dtype) -> None:
    args = random_tensors(SIZES[name], dtype, grad=True)
    torch.library.opcheck(OPERATORS[kernel_of(name)], args, call_kwargs(causal))


@pytest.mark.parametrize("name", list(OPERATORS))
def test_opcheck_passes_on_transposed_inputs(name: str) -> None:
    """Views with their last two dims swapped (for attention, ``[batch, seq, heads, head_dim]``
    transposed to ``[batch, heads, seq, head_dim]``, as a model's projections give them): the fake's
    strides are the kernel's output's (contiguous), not the inputs'."""
    stored: tuple[tuple[int, ...], ...]
    if name == "fused_attention":
        stored = tuple((b, s, h, d) for b, h, s, d in SIZES[name])
        tensors = tuple(t.transpose(1, 2) for t in random_tensors(stored, torch.float32))
    else:
        stored = tuple(size[:-2] + size[-2:][::-1] for size in SIZES[name])
        tensors = tuple(t.mT if t.dim() > 1 else t for t in random_tensors(stored, torch.float32))
    assert not tensors[0].is_contiguous()
    torch.library.opcheck(OPERATORS[name], tuple(t.requires_grad_() for t in tensors))


# -- gradients -----------------------------------------------------------------------------------

#: Small odd sizes for gradcheck in float64.
GRADCHECK_SIZES: dict[str, tuple[tuple[int, ...], ...]] = {
    "add": ((3, 5), (3, 5)),
    "softmax": ((3, 7),),
    "rms_norm": ((2, 3, 7), (7,)),
    "matmul": ((3, 5), (5, 7)),
}


@pytest.mark.parametrize("name", list(GRADCHECK_SIZES))
def test_gradcheck_in_float64(name: str) -> None:
    tensors = random_tensors(GRADCHECK_SIZES[name], torch.float64, seed=1, grad=True)
    assert torch.autograd.gradcheck(OPERATORS[name], tensors)


@pytest.mark.parametrize(("seq_q", "seq_kv"), [(5, 5), (5, 7), (7, 5)])
@pytest.mark.parametrize("causal", [0, 1, 2], ids=["full", "causal", "bottom-right"])
def test_gradcheck_of_attention_in_float64(causal: int, seq_q: int, seq_kv: int) -> None:
    """Both outputs (the log-sum-exp too), a scale, a mask broadcast over heads (its gradient
    summed over them) and grouped kv heads."""
    sizes = ((1, 4, seq_q, 3), (1, 2, seq_kv, 3), (1, 2, seq_kv, 3), (1, 1, seq_q, seq_kv))
    q, k, v, mask = random_tensors(sizes, torch.float64, seed=2, grad=True)

    def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        out, lse = OPS.fused_attention(q, k, v, mask, causal=causal, scale=0.7)
        return out, lse.nan_to_num(neginf=0.0)  # a row that sees no key (bottom-right, 7 > 5): -inf

    assert torch.autograd.gradcheck(attention, (q, k, v, mask))


def test_float64_runs_the_reference_and_asks_no_source() -> None:
    source = RecordingSource()
    with using_source(source):
        for name, causal in CALLS:
            tensors = random_tensors(SIZES[name], torch.float64)
            out = output(name, causal, tensors)
            assert out.dtype == torch.float64
            torch.testing.assert_close(out, torch_output(name, causal, tensors))
    assert source.asked == []


def assert_close_at_scale(got: Tensor, expected: Tensor) -> None:
    """``got`` is ``expected`` within :data:`FLOAT32_ATOL` of its largest magnitude (at least 1)."""
    scale = max(1.0, float(expected.abs().max()))
    torch.testing.assert_close(got, expected, atol=FLOAT32_ATOL * scale, rtol=FLOAT32_RTOL)


def values_and_grads(fn: Callable[..., Tensor], args: tuple[Tensor, ...], seed: int) -> list[Tensor]:
    """``fn``'s output and the gradients of its tensor arguments for a random output gradient."""
    leaves = [a.detach().clone().requires_grad_() for a in args]
    out = fn(*leaves)
    torch.autograd.backward(out, torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)))
    return [out.detach(), *(leaf.grad for leaf in leaves if leaf.grad is not None)]


@pytest.mark.parametrize(("name", "causal"), CALLS, ids=CALL_IDS)
def test_float32_gradients_match_torch(name: str, causal: int | None) -> None:
    args = random_tensors(SIZES[name], torch.float32, seed=3)
    ours = values_and_grads(lambda *t: output(name, causal, t), args, seed=4)
    theirs = values_and_grads(lambda *t: torch_output(name, causal, t), args, seed=4)
    assert len(ours) == len(theirs) == 1 + len(SIZES[name])
    for got, expected in zip(ours, theirs, strict=True):
        assert_close_at_scale(got, expected)


@pytest.mark.parametrize(("seq_q", "seq_kv"), [(56, 40), (37, 37), (24, 61)])
@pytest.mark.parametrize("causal", [0, 1, 2], ids=["full", "causal", "bottom-right"])
@pytest.mark.parametrize("kv_heads", [3, 1], ids=["mha", "mqa"])
@pytest.mark.parametrize("masked", [False, True], ids=["unmasked", "masked"])
def test_attention_gradients_match_sdpa_in_float32(
    causal: int, seq_q: int, seq_kv: int, kv_heads: int, masked: bool
) -> None:
    sizes: tuple[tuple[int, ...], ...] = (
        (2, 3, seq_q, 16),
        (2, kv_heads, seq_kv, 16),
        (2, kv_heads, seq_kv, 16),
    )
    if masked:
        sizes += ((2, 1, seq_q, seq_kv),)
    args = random_tensors(sizes, torch.float32, seed=5)
    if masked and causal != 2:  # padding: the last keys of the first sequence are hidden
        args[3].data[0, :, :, -3:] = float("-inf")
    ours = values_and_grads(lambda *t: OPS.fused_attention(*t, causal=causal)[0], args, seed=6)
    theirs = values_and_grads(lambda *t: torch_attention(*t, causal=causal), args, seed=6)
    for got, expected in zip(ours, theirs, strict=True):
        assert_close_at_scale(got, expected)


# -- the config source ---------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "causal"), CALLS, ids=CALL_IDS)
def test_each_call_asks_the_source_for_its_shape(name: str, causal: int | None) -> None:
    source = RecordingSource()
    with using_source(source):
        output(name, causal, random_tensors(SIZES[name], torch.float32))
    assert source.asked == [(kernel_of(name), looked_up_shape(name, causal), "float32")]


@pytest.mark.parametrize(("name", "causal"), CALLS, ids=CALL_IDS)
def test_a_valid_config_from_the_source_is_run(
    name: str, causal: int | None, caplog: pytest.LogCaptureFixture
) -> None:
    kernel, shape = kernel_of(name), looked_up_shape(name, causal)
    config = another_valid_config(kernel, shape)
    source = RecordingSource({kernel: config})
    tensors = random_tensors(SIZES[name], torch.float32)
    with caplog.at_level(logging.WARNING, logger="tiletune.kernels.launcher"), using_source(source):
        out = output(name, causal, tensors)
    assert source.asked == [(kernel, shape, "float32")]
    assert not [r for r in caplog.records if "refused" in r.getMessage()]
    selection = select_config(kernel, *tensors, client=source, **call_kwargs(causal))  # type: ignore[arg-type]
    assert (selection.source, selection.config) == ("client", config)
    assert_close_at_scale(out, torch_output(name, causal, tensors))


@pytest.mark.parametrize(("name", "causal"), CALLS, ids=CALL_IDS)
def test_an_invalid_config_from_the_source_is_refused_for_the_default(
    name: str, causal: int | None, caplog: pytest.LogCaptureFixture
) -> None:
    kernel, shape = kernel_of(name), looked_up_shape(name, causal)
    invalid = {**another_valid_config(kernel, shape), "buffer_num": 1, "pipeline_depth": 3}
    source = RecordingSource({kernel: invalid})
    tensors = random_tensors(SIZES[name], torch.float32, seed=7)
    with caplog.at_level(logging.WARNING, logger="tiletune.kernels.launcher"), using_source(source):
        out = output(name, causal, tensors)
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1
    assert refusals[0].startswith(kernel)
    assert "using the default" in refusals[0]
    assert_close_at_scale(out, torch_output(name, causal, tensors))


@pytest.fixture
def process_source(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No URL in the environment; the process's source is the rules again afterwards."""
    monkeypatch.delenv(URL_ENV, raising=False)
    try:
        yield
    finally:
        configure(None)


@pytest.mark.usefixtures("process_source")
def test_the_process_source_is_asked_unless_a_block_overrides_it() -> None:
    process, scoped = RecordingSource(), RecordingSource()
    x = random_tensors(SIZES["softmax"], torch.float32)
    assert configure(process) is process
    OPS.softmax(*x)
    with using_source(scoped):
        assert current_source() is scoped
        OPS.softmax(*x)
    assert current_source() is process
    assert configure() is None
    OPS.softmax(*x)
    assert len(process.asked) == len(scoped.asked) == 1


# -- torch.compile -------------------------------------------------------------------------------


def every_operator(*inputs: Tensor) -> tuple[Tensor, Tensor]:
    """A function of every operator: ``softmax(rms_norm(x, eps 1e-5) @ m)`` added to itself, and
    attention."""
    x, w, m, q, k, v = inputs
    h = OPS.softmax(OPS.matmul(OPS.rms_norm(x, w, 1e-5), m))  # an eps of its own: a float argument
    return OPS.add(h, h), OPS.fused_attention(q, k, v, causal=1)[0]


def every_operator_inputs(seq: int, *, grad: bool = False) -> tuple[Tensor, ...]:
    """Inputs of :func:`every_operator` for a sequence of ``seq`` tokens."""
    sizes = ((seq, 32), (32,), (32, 24), (1, 2, seq, 16), (1, 2, seq, 16), (1, 2, seq, 16))
    return random_tensors(sizes, torch.float32, seed=seq, grad=grad)


def every_operator_shapes(seq: int) -> list[tuple[str, dict[str, int], str]]:
    """What :func:`every_operator` asks its source for, in order, at ``seq`` tokens."""
    attention = {"batch": 1, "heads": 2, "kv_heads": 2, "seq_q": seq, "seq_kv": seq, "head_dim": 16}
    attention |= {"causal": 1, "mask": 0}
    shapes = [
        ("rms_norm", {"rows": seq, "cols": 32}),
        ("matmul", {"m": seq, "n": 24, "k": 32, "a_transposed": 0, "b_transposed": 0}),
        ("softmax", {"rows": seq, "cols": 24}),
        ("add", {"n": seq * 24}),
        ("fused_attention", attention),
    ]
    return [(name, shape, "float32") for name, shape in shapes]


@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_compiling_every_operator_makes_one_graph_that_gives_the_eager_results(dynamic: bool) -> None:
    inputs = every_operator_inputs(40)
    explanation = torch._dynamo.explain(every_operator)(*inputs)
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0)
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(every_operator, fullgraph=True, dynamic=dynamic, backend=counter)
    for got, expected in zip(compiled(*inputs), every_operator(*inputs), strict=True):
        torch.testing.assert_close(got, expected)
    assert counter.frame_count == 1
    assert counter.op_count == len(OPERATORS) + 1  # and the getitem of attention's output


@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_a_compiled_call_asks_the_source_for_its_shape_when_it_runs(dynamic: bool) -> None:
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(every_operator, fullgraph=True, dynamic=dynamic, backend=counter)
    source = RecordingSource()
    with using_source(source):
        for seq in (40, 45, 40):
            compiled(*every_operator_inputs(seq))
    # per call, every operator's shape (the compiled graph may order the independent ones its way)
    calls = [source.asked[i : i + len(OPERATORS)] for i in range(0, len(source.asked), len(OPERATORS))]
    assert [sorted(map(repr, call)) for call in calls] == [
        sorted(map(repr, every_operator_shapes(seq))) for seq in (40, 45, 40)
    ]
    assert counter.frame_count == (1 if dynamic else 2)  # the last call reuses the first graph


def squared_outputs(*inputs: Tensor) -> Tensor:
    """A loss of :func:`every_operator`'s outputs."""
    h, attention = every_operator(*inputs)
    return (h * h).sum() + (attention * attention).sum()


@pytest.mark.usefixtures("fresh_dynamo")
def test_backward_through_a_compiled_function_gives_the_eager_gradients() -> None:
    """Inductor builds the backward formulas' C++ (the slowest test here when its cache is cold)."""
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(squared_outputs, fullgraph=True, backend=counter)
    eager_inputs, compiled_inputs = every_operator_inputs(40, grad=True), every_operator_inputs(40, grad=True)
    eager_loss, compiled_loss = squared_outputs(*eager_inputs), compiled(*compiled_inputs)
    torch.autograd.backward(eager_loss)
    torch.autograd.backward(compiled_loss)
    torch.testing.assert_close(compiled_loss, eager_loss)
    for got, expected in zip(compiled_inputs, eager_inputs, strict=True):
        assert got.grad is not None
        assert expected.grad is not None
        assert expected.grad.abs().sum() > 0
        torch.testing.assert_close(got.grad, expected.grad)
    assert counter.frame_count == 1


@pytest.mark.usefixtures("fresh_dynamo")
def test_compiled_attention_on_transposed_projections_gives_the_eager_result() -> None:
    """Inductor relies on the fake's strides for the views after the operator."""

    def heads_attention(x: Tensor) -> Tensor:
        batch, seq, hidden = x.shape
        q = x.view(batch, seq, 4, hidden // 4).transpose(1, 2)
        out: Tensor = OPS.fused_attention(q, q, q, causal=1)[0]
        return out.transpose(1, 2).reshape(batch, seq, hidden)

    (x,) = random_tensors(((2, 24, 32),), torch.float32)
    compiled = torch.compile(heads_attention, fullgraph=True)
    torch.testing.assert_close(compiled(x), heads_attention(x))


# -- autocast ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
def test_autocast_runs_matmul_and_attention_in_its_dtype_and_the_others_as_given(dtype: torch.dtype) -> None:
    """As torch's ``mm`` and attention: float32 inputs cast to the region's dtype; the row kernels keep
    their input's dtype; every leaf's gradient comes back in its own dtype."""
    x, w, m, q = random_tensors(((6, 32), (32,), (32, 8), (1, 2, 6, 16)), torch.float32, grad=True)
    with torch.autocast("cpu", dtype=dtype):
        product = OPS.matmul(x, m)
        attention, lse = OPS.fused_attention(q, q, q, causal=1)
        normed = OPS.rms_norm(x, w)
    assert (product.dtype, attention.dtype, lse.dtype, normed.dtype) == (
        dtype,
        dtype,
        torch.float32,
        torch.float32,
    )
    torch.testing.assert_close(
        product.float(), x.to(dtype).float() @ m.to(dtype).float(), atol=0.05, rtol=0.02
    )
    (product.float().sum() + attention.float().sum() + normed.sum()).backward()
    assert all(t.grad is not None and t.grad.dtype == torch.float32 for t in (x, w, m, q))


@pytest.mark.parametrize("causal", [0, 2], ids=["full", "bottom-right"])
def test_opcheck_passes_for_the_attention_backward_operator(causal: int) -> None:
    """``fused_attention_backward``, the node a compiled backward calls: schema, fake, dispatch."""
    sizes = ((1, 4, 24, 16), (1, 2, 40, 16), (1, 2, 40, 16), (1, 1, 24, 40))
    q, k, v, mask = random_tensors(sizes, torch.float32, seed=11)
    out, lse = OPS.fused_attention(q, k, v, mask, causal=causal)
    grad, grad_lse = torch.randn_like(out), torch.randn_like(lse)
    args = (q, k, v, mask, out, lse, grad, grad_lse)
    torch.library.opcheck(OPS.fused_attention_backward, args, {"causal": causal, "scale": 0.3})


# -- eps, rms_norm's call argument ---------------------------------------------------------------

#: eps other than the operator's default: a Hugging Face checkpoint's, float32's machine epsilon.
OTHER_EPS = (1e-5, torch.finfo(torch.float32).eps)


def small_rms_norm_inputs(
    dtype: torch.dtype, sizes: tuple[tuple[int, ...], ...] = SIZES["rms_norm"], *, seed: int = 0
) -> tuple[Tensor, Tensor]:
    """``rms_norm``'s ``x`` (of magnitude 1e-3: ``mean(x^2)`` about 1e-6, so that ``eps`` moves the
    result) and weight."""
    x, weight = random_tensors(sizes, dtype, seed=seed)
    return x * 1e-3, weight


def test_opcheck_passes_for_rms_norm_and_its_backward_at_another_eps() -> None:
    x, weight = small_rms_norm_inputs(torch.float32)
    torch.library.opcheck(OPS.rms_norm, (x.requires_grad_(), weight.requires_grad_(), 1e-5))
    grad = torch.randn(x.shape, generator=torch.Generator().manual_seed(9))
    torch.library.opcheck(OPS.rms_norm_backward, (x.detach(), weight.detach(), grad, 1e-5))


def test_gradcheck_of_rms_norm_in_float64_at_another_eps() -> None:
    """The backward runs at the forward's eps: at another, its gradients would not be the forward's."""
    x, weight = small_rms_norm_inputs(torch.float64, GRADCHECK_SIZES["rms_norm"], seed=1)
    x.requires_grad_()
    weight.requires_grad_()
    assert torch.autograd.gradcheck(lambda x, w: OPS.rms_norm(x, w, 1e-5), (x, weight))
    with torch.no_grad():
        torch.testing.assert_close(OPS.rms_norm(x, weight, 1e-5), functional.rms_norm(x, (7,), weight, 1e-5))


def rms_norm_source(answer: str) -> RecordingSource:
    """A source answering ``rms_norm`` and its backward with the kernels' rules (``rule``: the native
    kernel on CPUs where it is built), torch's op (``vendor``) or another tiled config (``tiled``)."""
    shape = SHAPES["rms_norm"]
    if answer == "vendor":
        return RecordingSource({"rms_norm": VENDOR_CONFIG, "rms_norm_backward": VENDOR_CONFIG})
    if answer == "tiled":
        kernels = ("rms_norm", "rms_norm_backward")
        return RecordingSource({kernel: another_valid_config(kernel, shape) for kernel in kernels})
    return RecordingSource()


@pytest.mark.parametrize("eps", OTHER_EPS, ids=["1e-5", "finfo"])
@pytest.mark.parametrize("answer", ["rule", "vendor", "tiled"])
def test_rms_norm_values_and_gradients_match_torch_at_the_calls_eps(answer: str, eps: float) -> None:
    """Whatever runs the call computes at its eps; the key looked up has no eps."""
    args = small_rms_norm_inputs(torch.float32, seed=3)
    source = rms_norm_source(answer)
    with using_source(source):
        ours = values_and_grads(lambda x, w: OPS.rms_norm(x, w, eps), args, seed=4)
    theirs = values_and_grads(lambda x, w: functional.rms_norm(x, (300,), w, eps), args, seed=4)
    for got, expected in zip(ours, theirs, strict=True):
        assert_close_at_scale(got, expected)
    shape = SHAPES["rms_norm"]
    assert source.asked == [("rms_norm", shape, "float32"), ("rms_norm_backward", shape, "float32")]


@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_compiled_rms_norm_at_another_eps_is_one_graph_with_torchs_results(dynamic: bool) -> None:
    def norm(x: Tensor, weight: Tensor) -> Tensor:
        out: Tensor = OPS.rms_norm(x, weight, 1e-5)
        return out

    args = small_rms_norm_inputs(torch.float32, seed=5)
    explanation = torch._dynamo.explain(norm)(*args)
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0)
    compiled = torch.compile(norm, fullgraph=True, dynamic=dynamic)
    ours = values_and_grads(compiled, args, seed=6)
    theirs = values_and_grads(lambda x, w: functional.rms_norm(x, (300,), w, 1e-5), args, seed=6)
    for got, expected in zip(ours, theirs, strict=True):
        assert_close_at_scale(got, expected)


def test_a_call_argument_a_kernel_does_not_take_is_a_type_error() -> None:
    (x,) = random_tensors(SIZES["softmax"], torch.float32)
    with pytest.raises(TypeError, match=r"softmax takes no call argument eps \(it takes: none\)"):
        run_kernel("softmax", (x,), arguments={"eps": 1e-5})
