"""``torch.ops.tiletune.*``: opcheck, gradients (gradcheck, and against torch's own ops), the config
source asked per call, and ``torch.compile`` with no graph break, forward and backward."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import pytest
import torch
from torch import Tensor
from torch._dynamo.testing import CompileCounterWithBackend
from torch.nn import functional

from tiletune.kernels import select_config
from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.device import cpu_chip
from tiletune.kernels.ops import OPERATORS, configure, current_source, using_source
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
}
#: The shape each call of :data:`SIZES` is looked up under (attention's without ``causal``).
SHAPES: dict[str, Shape] = {
    "add": {"n": 3005},
    "softmax": {"rows": 37, "cols": 300},
    "rms_norm": {"rows": 37, "cols": 300},
    "matmul": {"m": 37, "n": 100, "k": 300},
    "fused_attention": {"batch": 1, "heads": 2, "seq_q": 40, "seq_kv": 56, "head_dim": 16},
}
#: A tiled dim of each kernel and the knob that tiles it.
TILED: dict[str, tuple[str, str]] = {
    "add": ("n", "tile_size"),
    "softmax": ("cols", "tile_cols"),
    "rms_norm": ("cols", "tile_cols"),
    "matmul": ("m", "tile_m"),
    "fused_attention": ("seq_q", "block_q"),
}
#: Every call of the tests: an operator, and for attention whether it is causal.
CALLS = [
    ("add", None),
    ("softmax", None),
    ("rms_norm", None),
    ("matmul", None),
    ("fused_attention", False),
    ("fused_attention", True),
]
CALL_IDS = ["add", "softmax", "rms_norm", "matmul", "fused_attention", "fused_attention-causal"]


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


def call_args(name: str, causal: bool | None, tensors: tuple[Tensor, ...]) -> tuple[Tensor | bool, ...]:
    """The operator's arguments: the tensors, then ``causal`` for attention."""
    return tensors if causal is None else (*tensors, causal)


def torch_rms_norm(x: Tensor, weight: Tensor) -> Tensor:
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + EPS) * weight


def torch_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> Tensor:
    """PyTorch's attention, top-left causal by an explicit mask (query ``i`` sees keys ``j <= i``)."""
    mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril() if causal else None
    return functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


#: torch's own op for each operator (attention takes ``causal`` last).
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


def looked_up_shape(name: str, causal: bool | None) -> Shape:
    return SHAPES[name] if causal is None else {**SHAPES[name], "causal": int(causal)}


def another_valid_config(name: str, shape: Shape) -> Config:
    """A valid config of the kernel other than its default."""
    spec = get_kernel(name)
    default = spec.default_config(shape, "float32", LIMITS)
    return next(c for c in spec.space(shape, "float32", LIMITS) if c != default)


def test_the_default_tiles_do_not_divide_the_tested_shapes() -> None:
    for name, (dim, knob) in TILED.items():
        shape = looked_up_shape(name, False if name == "fused_attention" else None)
        tile = get_kernel(name).default_config(shape, "float32", LIMITS)[knob]
        assert shape[dim] % tile != 0, name


# -- opcheck -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["float32", "float16"])
@pytest.mark.parametrize(("name", "causal"), CALLS, ids=CALL_IDS)
def test_opcheck_passes(name: str, causal: bool | None, dtype: torch.dtype) -> None:
    args = call_args(name, causal, random_tensors(SIZES[name], dtype, grad=True))
    torch.library.opcheck(OPERATORS[name], args)


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
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gradcheck_of_attention_in_float64(causal: bool, seq_q: int, seq_kv: int) -> None:
    sizes = ((1, 2, seq_q, 3), (1, 2, seq_kv, 3), (1, 2, seq_kv, 3))
    q, k, v = random_tensors(sizes, torch.float64, seed=2, grad=True)
    assert torch.autograd.gradcheck(lambda q, k, v: OPS.fused_attention(q, k, v, causal), (q, k, v))


def test_float64_runs_the_reference_and_asks_no_source() -> None:
    source = RecordingSource()
    with using_source(source):
        for name, causal in CALLS:
            tensors = random_tensors(SIZES[name], torch.float64)
            out = OPERATORS[name](*call_args(name, causal, tensors))
            assert out.dtype == torch.float64
            torch.testing.assert_close(out, TORCH_OPS[name](*call_args(name, causal, tensors)))
    assert source.asked == []


def assert_close_at_scale(got: Tensor, expected: Tensor) -> None:
    """``got`` is ``expected`` within :data:`FLOAT32_ATOL` of its largest magnitude (at least 1)."""
    scale = max(1.0, float(expected.abs().max()))
    torch.testing.assert_close(got, expected, atol=FLOAT32_ATOL * scale, rtol=FLOAT32_RTOL)


def values_and_grads(fn: Callable[..., Tensor], args: tuple[Tensor | bool, ...], seed: int) -> list[Tensor]:
    """``fn``'s output and the gradients of its tensor arguments for a random output gradient."""
    leaves = [a.detach().clone().requires_grad_() if isinstance(a, Tensor) else a for a in args]
    out = fn(*leaves)
    torch.autograd.backward(out, torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)))
    return [
        out.detach(),
        *(leaf.grad for leaf in leaves if isinstance(leaf, Tensor) and leaf.grad is not None),
    ]


@pytest.mark.parametrize(("name", "causal"), CALLS, ids=CALL_IDS)
def test_float32_gradients_match_torch(name: str, causal: bool | None) -> None:
    args = call_args(name, causal, random_tensors(SIZES[name], torch.float32, seed=3))
    ours = values_and_grads(OPERATORS[name], args, seed=4)
    theirs = values_and_grads(TORCH_OPS[name], args, seed=4)
    assert len(ours) == len(theirs) == 1 + len(SIZES[name])
    for got, expected in zip(ours, theirs, strict=True):
        assert_close_at_scale(got, expected)


@pytest.mark.parametrize(("seq_q", "seq_kv"), [(56, 40), (37, 37)])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_attention_gradients_match_sdpa_in_float32(causal: bool, seq_q: int, seq_kv: int) -> None:
    sizes = ((2, 3, seq_q, 16), (2, 3, seq_kv, 16), (2, 3, seq_kv, 16))
    args: tuple[Tensor | bool, ...] = (*random_tensors(sizes, torch.float32, seed=5), causal)
    ours = values_and_grads(OPS.fused_attention, args, seed=6)
    theirs = values_and_grads(torch_attention, args, seed=6)
    for got, expected in zip(ours, theirs, strict=True):
        assert_close_at_scale(got, expected)


# -- the config source ---------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "causal"), CALLS, ids=CALL_IDS)
def test_each_call_asks_the_source_for_its_shape(name: str, causal: bool | None) -> None:
    source = RecordingSource()
    args = call_args(name, causal, random_tensors(SIZES[name], torch.float32))
    with using_source(source):
        OPERATORS[name](*args)
    assert source.asked == [(name, looked_up_shape(name, causal), "float32")]


@pytest.mark.parametrize(("name", "causal"), CALLS, ids=CALL_IDS)
def test_a_valid_config_from_the_source_is_run(
    name: str, causal: bool | None, caplog: pytest.LogCaptureFixture
) -> None:
    shape = looked_up_shape(name, causal)
    config = another_valid_config(name, shape)
    source = RecordingSource({name: config})
    tensors = random_tensors(SIZES[name], torch.float32)
    with caplog.at_level(logging.WARNING, logger="tiletune.kernels.launcher"), using_source(source):
        out = OPERATORS[name](*call_args(name, causal, tensors))
    assert source.asked == [(name, shape, "float32")]
    assert not [r for r in caplog.records if "refused" in r.getMessage()]
    if causal is None:
        selection = select_config(name, *tensors, client=source)
    else:
        selection = select_config(name, *tensors, client=source, causal=causal)
    assert (selection.source, selection.config) == ("client", config)
    assert_close_at_scale(out, TORCH_OPS[name](*call_args(name, causal, tensors)))


@pytest.mark.parametrize(("name", "causal"), CALLS, ids=CALL_IDS)
def test_an_invalid_config_from_the_source_is_refused_for_the_default(
    name: str, causal: bool | None, caplog: pytest.LogCaptureFixture
) -> None:
    shape = looked_up_shape(name, causal)
    invalid = {**another_valid_config(name, shape), "buffer_num": 1, "pipeline_depth": 3}
    source = RecordingSource({name: invalid})
    tensors = random_tensors(SIZES[name], torch.float32, seed=7)
    with caplog.at_level(logging.WARNING, logger="tiletune.kernels.launcher"), using_source(source):
        out = OPERATORS[name](*call_args(name, causal, tensors))
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1
    assert refusals[0].startswith(name)
    assert "using the default" in refusals[0]
    assert_close_at_scale(out, TORCH_OPS[name](*call_args(name, causal, tensors)))


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
    """A function of every operator: ``softmax(rms_norm(x) @ m)`` added to itself, and attention."""
    x, w, m, q, k, v = inputs
    h = OPS.softmax(OPS.matmul(OPS.rms_norm(x, w), m))
    return OPS.add(h, h), OPS.fused_attention(q, k, v, True)


def every_operator_inputs(seq: int, *, grad: bool = False) -> tuple[Tensor, ...]:
    """Inputs of :func:`every_operator` for a sequence of ``seq`` tokens."""
    sizes = ((seq, 32), (32,), (32, 24), (1, 2, seq, 16), (1, 2, seq, 16), (1, 2, seq, 16))
    return random_tensors(sizes, torch.float32, seed=seq, grad=grad)


def every_operator_shapes(seq: int) -> list[tuple[str, dict[str, int], str]]:
    """What :func:`every_operator` asks its source for, in order, at ``seq`` tokens."""
    attention = {"batch": 1, "heads": 2, "seq_q": seq, "seq_kv": seq, "head_dim": 16, "causal": 1}
    shapes = [
        ("rms_norm", {"rows": seq, "cols": 32}),
        ("matmul", {"m": seq, "n": 24, "k": 32}),
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
    assert counter.op_count == len(OPERATORS)


@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_a_compiled_call_asks_the_source_for_its_shape_when_it_runs(dynamic: bool) -> None:
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(every_operator, fullgraph=True, dynamic=dynamic, backend=counter)
    source = RecordingSource()
    with using_source(source):
        for seq in (40, 45, 40):
            compiled(*every_operator_inputs(seq))
    assert source.asked == [
        *every_operator_shapes(40),
        *every_operator_shapes(45),
        *every_operator_shapes(40),
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
        out: Tensor = OPS.fused_attention(q, q, q, True)
        return out.transpose(1, 2).reshape(batch, seq, hidden)

    (x,) = random_tensors(((2, 24, 32),), torch.float32)
    compiled = torch.compile(heads_attention, fullgraph=True)
    torch.testing.assert_close(compiled(x), heads_attention(x))
