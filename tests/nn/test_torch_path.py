"""An answer of torch's op runs torch's function itself (``tiletune.kernels.ops.torch_path``): no
operator, torch's autograd, one lookup per key; anything else runs the operator as before."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from torch.nn import functional as torch_functional
from torch.profiler import profile

import tiletune.nn
from tests.sources import Answer, MeasuredRules
from tiletune.kernels.device import cpu_chip
from tiletune.kernels.ops import torch_path, using_source
from tiletune.kernels.registry import get_kernel
from tiletune.nn import functional
from tiletune.nn.functional import AttentionMode

VENDOR = {"vendor": 1}
LIMITS = cpu_chip().limits


@dataclass
class KeyedSource:
    """A config source answering torch's op for every key but those of ``tiled`` (a kernel and the
    shape's items), which get their kernel's default rule as a measured answer; it counts lookups
    and gives the same answer object for the same answer, as a ``ConfigClient`` does."""

    tiled: set[tuple[str, tuple[tuple[str, int], ...]]] = field(default_factory=set)
    lookups: int = 0
    answers: dict[tuple[str, tuple[tuple[str, int], ...], bool], Answer] = field(default_factory=dict)

    def get(self, kernel: str, shape: Mapping[str, int], /, *, dtype: str) -> Answer:
        """The answer for the key (see the class)."""
        self.lookups += 1
        key = (kernel, tuple(shape.items()))
        tiled = key in self.tiled
        if (*key, tiled) not in self.answers:
            rule = get_kernel(kernel).default_config(dict(shape), dtype, LIMITS)
            self.answers[(*key, tiled)] = Answer(rule if tiled else VENDOR)
        return self.answers[(*key, tiled)]


def operators_run(call: Callable[[], object]) -> set[str]:
    """The ``tiletune::`` operators ``call`` runs, by a profile of it."""
    with profile() as trace:
        call()
    return {event.name for event in trace.events() if event.name.startswith("tiletune::")}


def linear_inputs(requires_grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(2, 24, 32, generator=generator, requires_grad=requires_grad)
    weight = torch.nn.Parameter(torch.randn(48, 32, generator=generator), requires_grad=requires_grad)
    return x, weight


@pytest.fixture(autouse=True)
def fresh_decisions(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test decides afresh (the decisions are the process's)."""
    monkeypatch.setattr(torch_path, "_decisions", {})


def test_untuned_linear_runs_torch_linear_its_gradients_too() -> None:
    x, weight = linear_inputs(requires_grad=True)
    grad = torch.randn(2, 24, 48, generator=torch.Generator().manual_seed(4))
    gradients: list[tuple[torch.Tensor, ...]] = []

    def step() -> None:
        out = functional.linear(x, weight)
        assert torch.equal(out, torch_functional.linear(x, weight))
        gradients.append(torch.autograd.grad(out, (x, weight), grad))

    with using_source(None):
        assert operators_run(step) == set()  # forward and backward
    expected = torch.autograd.grad(torch_functional.linear(x, weight), (x, weight), grad)
    assert all(torch.equal(a, b) for a, b in zip(gradients[0], expected, strict=True))


def test_untuned_attention_runs_torch_attention_masked_or_not() -> None:
    generator = torch.Generator().manual_seed(2)
    q = torch.randn(1, 4, 40, 16, generator=generator).transpose(1, 2).contiguous().transpose(1, 2)
    k, v = (torch.randn(1, 2, 40, 16, generator=generator) for _ in range(2))
    mask = torch.ones(40, 40, dtype=torch.bool).tril()

    def call() -> torch.Tensor:
        return functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    def masked() -> torch.Tensor:
        return functional.scaled_dot_product_attention(q, k, v, mask, enable_gqa=True)

    with using_source(None), torch.no_grad():
        assert operators_run(call) == set()
        expected = torch_functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        assert torch.equal(call(), expected)
        assert operators_run(masked) == set()  # a mask: torch's function, called as the model called it
        expected = torch_functional.scaled_dot_product_attention(q, k, v, mask, enable_gqa=True)
        assert torch.equal(masked(), expected)
    with using_source(MeasuredRules()), torch.no_grad():  # tiled answers: the operator, mask and all
        assert operators_run(masked) == {"tiletune::fused_attention"}


def test_a_tiled_answer_runs_the_operator() -> None:
    x, weight = linear_inputs(requires_grad=False)
    shape = get_kernel("matmul").shape_of((x.reshape(-1, 32), weight.t()))
    source = KeyedSource(tiled={("matmul", tuple(shape.items()))})
    with using_source(source):
        assert operators_run(lambda: functional.linear(x, weight)) == {"tiletune::matmul"}
    source = KeyedSource()
    with using_source(source):
        assert operators_run(lambda: functional.linear(x, weight)) == set()
        source.tiled = {("matmul", tuple(shape.items()))}  # a tiled answer arrives: the next call runs it
        assert operators_run(lambda: functional.linear(x, weight)) == {"tiletune::matmul"}


def test_a_tiled_backward_key_keeps_a_recorded_call_on_the_operator() -> None:
    x, weight = linear_inputs(requires_grad=True)
    matmul = get_kernel("matmul")
    grad_out = torch.empty(48, 48)
    rows = x.detach().reshape(-1, 32)
    weight_grad_key = matmul.shape_of((grad_out.t(), rows))  # db of rows @ weight.t(): (g^T rows)^T
    source = KeyedSource(tiled={("matmul", tuple(weight_grad_key.items()))})
    with using_source(source):
        assert operators_run(lambda: functional.linear(x, weight)) == {"tiletune::matmul"}
        with torch.no_grad():  # no backward: the forward's key alone decides
            assert operators_run(lambda: functional.linear(x, weight)) == set()


def test_a_decided_call_looks_each_key_up_once() -> None:
    x, weight = linear_inputs(requires_grad=True)
    source = KeyedSource()
    with using_source(source):
        functional.linear(x, weight)  # decides: the forward's key and the backward's two
        before = source.lookups
        functional.linear(x, weight)
        assert source.lookups - before == 3
        with torch.no_grad():
            functional.linear(x, weight)
            before = source.lookups
            functional.linear(x, weight)
        assert source.lookups - before == 1


def test_an_operator_decision_is_checked_again_after_its_recheck(monkeypatch: pytest.MonkeyPatch) -> None:
    x, weight = linear_inputs(requires_grad=False)
    shape = get_kernel("matmul").shape_of((x.reshape(-1, 32), weight.t()))
    source = KeyedSource(tiled={("matmul", tuple(shape.items()))})
    with using_source(source):
        functional.linear(x, weight)
        before = source.lookups
        functional.linear(x, weight)  # the operator looks the key up; the decision does not, yet
        assert source.lookups - before == 1
        monkeypatch.setattr(torch_path, "RECHECK_S", 0.0)
        monkeypatch.setattr(torch_path, "_decisions", {})
        functional.linear(x, weight)  # decided with a recheck of 0 s: due at the next call
        source.tiled = set()
        assert operators_run(lambda: functional.linear(x, weight)) == set()


def test_a_patched_models_layers_read_their_tensors_outside_the_attention_mode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[object] = []
    own = AttentionMode.__torch_function__

    def counting(self: AttentionMode, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        calls.append(func)
        return own(self, func, types, args, kwargs)

    monkeypatch.setattr(AttentionMode, "__torch_function__", counting)
    model = tiletune.nn.patch(torch.nn.Sequential(torch.nn.RMSNorm(32, eps=1e-6), torch.nn.Linear(32, 8)))
    with using_source(None), torch.no_grad():
        model(torch.randn(4, 32))
    assert calls == []


def test_a_compiled_call_keeps_the_operator() -> None:
    x, weight = linear_inputs(requires_grad=False)
    compiled = torch.compile(functional.linear, fullgraph=True, backend="eager")
    with using_source(None), torch.no_grad():
        assert operators_run(lambda: compiled(x, weight)) == {"tiletune::matmul"}
        assert torch.allclose(compiled(x, weight), torch_functional.linear(x, weight), atol=1e-5)
