"""``tiletune.nn.patch``: a plain ``torch.nn`` model runs on tiletune's operators, unchanged in its code
and its results, eagerly and under ``torch.compile(fullgraph=True)``; it says what it replaced and
what it left, and why (``tiletune.nn.patch_summary``, one log line per call)."""

from __future__ import annotations

import logging
import pickle
from typing import Any

import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounter
from torch.nn import functional as torch_functional
from torch.profiler import profile
from torch.utils._python_dispatch import TorchDispatchMode

import tiletune
import tiletune.nn
from tiletune.nn import Linear, PatchSummary, RMSNorm, patch_summary
from tiletune.nn.patch import NO_OPERATOR


class Block(torch.nn.Module):
    """A pre-norm attention block as model code writes it: torch's modules, torch's SDPA."""

    def __init__(self, hidden: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.norm = torch.nn.RMSNorm(hidden, eps=1e-6)
        self.qkv = torch.nn.Linear(hidden, 3 * hidden)
        self.out = torch.nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        q, k, v = self.qkv(self.norm(x)).view(batch, seq, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        attention = torch_functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        out: torch.Tensor = x + self.out(attention.transpose(1, 2).reshape(batch, seq, hidden))
        return out


def patched_pair() -> tuple[Block, Block]:
    torch.manual_seed(0)
    model, reference = Block(), Block()
    reference.load_state_dict(model.state_dict())
    return tiletune.nn.patch(model), reference


@pytest.mark.usefixtures("tiled_answers")
def test_patch_swaps_the_layers_and_keeps_parameters_and_results() -> None:
    model, reference = patched_pair()
    assert type(model.norm) is RMSNorm
    assert type(model.qkv) is Linear
    assert model.state_dict().keys() == reference.state_dict().keys()
    x = torch.randn(2, 40, 64)

    torch.testing.assert_close(model(x), reference(x), atol=1e-5, rtol=1e-4)
    with profile() as trace:
        model(x)
    operators = {event.name for event in trace.events() if event.name.startswith("tiletune::")}
    assert operators == {"tiletune::rms_norm", "tiletune::matmul", "tiletune::fused_attention"}


def test_a_patched_model_compiles_whole_and_trains_like_torchs() -> None:
    model, reference = patched_pair()
    for dynamic in (False, True):
        torch._dynamo.reset()
        counter = CompileCounter()
        compiled = torch.compile(model, fullgraph=True, dynamic=dynamic, backend=counter)
        for seq in (24, 31):
            x = torch.randn(1, seq, 64)
            torch.testing.assert_close(compiled(x), reference(x), atol=1e-5, rtol=1e-4)
        assert counter.frame_count >= 1
    x = torch.randn(2, 24, 64)
    torch.autograd.backward(compiled(x).square().mean())
    torch.autograd.backward(reference(x).square().mean())
    for (name, mine), theirs in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert mine.grad is not None, name
        torch.testing.assert_close(mine.grad, theirs.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_a_patched_model_runs_and_trains_under_autocast() -> None:
    """Under CPU autocast torch's layers hand bfloat16 activations to float32 weights: the operators
    take the mixed dtypes (in the first input's), and each gradient comes back in its parameter's."""
    model, reference = patched_pair()
    x = torch.randn(2, 40, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours, theirs = model(x), reference(x)
    torch.testing.assert_close(ours.float(), theirs.float(), atol=2e-2, rtol=2e-2)
    torch.autograd.backward(ours.float().square().mean())
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None, name
        assert parameter.grad.dtype == parameter.dtype, name


@pytest.mark.usefixtures("tiled_answers")
def test_a_patched_model_pickles_whole_and_loads_patched() -> None:
    """``torch.save(model)`` of a patched model: it loads with tiletune's layers and forward."""
    model, reference = patched_pair()
    loaded = pickle.loads(pickle.dumps(model))
    x = torch.randn(1, 20, 64)
    torch.testing.assert_close(loaded(x), reference(x), atol=1e-5, rtol=1e-4)
    with profile() as trace:
        loaded(x)
    assert "tiletune::fused_attention" in {event.name for event in trace.events()}
    assert patch_summary(loaded) == patch_summary(model)
    assert tiletune.patch(loaded) is loaded  # patching again changes nothing
    assert type(loaded.norm) is RMSNorm


class DoubledLinear(torch.nn.Linear):
    """A subclass of ``nn.Linear`` with a forward of its own."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2.0 * super().forward(x)


class Mixed(torch.nn.Module):
    """The block, then modules patch leaves: a LayerNorm, an RMSNorm with no weight, a Linear subclass
    (and the block's norm once more, shared)."""

    def __init__(self) -> None:
        super().__init__()
        self.block = Block()
        self.layer_norm = torch.nn.LayerNorm(64)
        self.plain = torch.nn.RMSNorm(64, eps=1e-6, elementwise_affine=False)
        self.head = DoubledLinear(64, 64)
        self.shared = self.block.norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.plain(self.layer_norm(self.shared(self.block(x)))))
        return out


def patch_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name.startswith("tiletune")]


def test_the_summary_says_what_was_replaced_and_what_was_left_and_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    torch.manual_seed(0)
    model, reference = Mixed(), Mixed()
    reference.load_state_dict(model.state_dict())
    with caplog.at_level(logging.INFO, logger="tiletune"):
        assert tiletune.nn.patch(model) is model

    assert patch_summary(model) == PatchSummary(
        replaced={"Linear": 2, "RMSNorm": 1},
        left={
            ("LayerNorm", NO_OPERATOR): 1,
            ("RMSNorm", "no affine weight"): 1,
            ("DoubledLinear", "a subclass of nn.Linear: its forward may differ"): 1,
        },
        attention="routed",
    )
    assert patch_lines(caplog) == [
        "tiletune.patch: replaced 2 Linear, 1 RMSNorm; attention routed through tiletune; left 1 LayerNorm "
        "(no tiletune operator), 1 RMSNorm (no affine weight), 1 DoubledLinear (a subclass of nn.Linear: "
        "its forward may differ)"
    ]
    assert type(model.plain) is torch.nn.RMSNorm
    assert type(model.head) is DoubledLinear
    assert type(model.layer_norm) is torch.nn.LayerNorm
    x = torch.randn(2, 24, 64)
    torch.testing.assert_close(model(x), reference(x), atol=1e-5, rtol=1e-4)


def test_patching_again_counts_each_module_once_and_wraps_the_forward_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model, reference = patched_pair()
    first, forward = patch_summary(model), model.__dict__["forward"]
    with caplog.at_level(logging.INFO, logger="tiletune"):
        tiletune.nn.patch(model)

    again = patch_summary(model)
    assert first is not None
    assert again is not None
    assert first.replaced == again.replaced == {"Linear": 2, "RMSNorm": 1}
    assert (first.attention, again.attention) == ("routed", "already routed")
    assert patch_lines(caplog) == [str(again)]
    assert model.__dict__["forward"] is forward
    x = torch.randn(1, 20, 64)
    torch.testing.assert_close(model(x), reference(x), atol=1e-5, rtol=1e-4)


def test_a_model_never_patched_has_no_summary() -> None:
    assert patch_summary(Block()) is None


class TiletuneCalls(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Records each ``tiletune::`` operator call the dispatcher sees: its name and its arguments that
    are not tensors (``rms_norm``'s eps)."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.calls: list[tuple[str, tuple[object, ...]]] = []

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        """Record ``func`` when it is one of tiletune's operators, then run it."""
        kwargs = kwargs or {}
        if func.namespace == "tiletune":
            values = [*args, *kwargs.values()]
            scalars = tuple(v for v in values if not isinstance(v, torch.Tensor))
            self.calls.append((func._schema.name, scalars))
        return func(*args, **kwargs)


def patched_rms_norm_pair(eps: float | None) -> tuple[torch.nn.Sequential, torch.nn.RMSNorm]:
    """A patched ``torch.nn.RMSNorm(48, eps=eps)`` (in a ``Sequential``) and torch's, one weight."""
    torch.manual_seed(0)
    reference = torch.nn.RMSNorm(48, eps=eps)
    reference.weight.data.uniform_(0.5, 1.5)
    model = torch.nn.Sequential(torch.nn.RMSNorm(48, eps=eps))
    model.load_state_dict(torch.nn.Sequential(reference).state_dict())
    tiletune.nn.patch(model)
    assert type(model[0]) is RMSNorm
    return model, reference


@pytest.mark.parametrize("eps", [None, 1e-5], ids=["torchs-default", "1e-5"])
def test_a_patched_torch_rms_norm_runs_the_operator_at_its_eps_with_torchs_results(eps: float | None) -> None:
    """``None`` (torch's default) is the dtype's machine epsilon. ``x`` of magnitude 1e-3 makes
    ``mean(x^2)`` about 1e-6, so that the eps moves the result."""
    model, reference = patched_rms_norm_pair(eps)
    x, grad = torch.randn(3, 7, 48) * 1e-3, torch.randn(3, 7, 48)
    ours_x, theirs_x = x.clone().requires_grad_(), x.clone().requires_grad_()
    with TiletuneCalls() as recorded:
        ours = model(ours_x)
        ours.backward(grad)
    theirs = reference(theirs_x)
    theirs.backward(grad)

    at = torch.finfo(torch.float32).eps if eps is None else eps
    assert recorded.calls == [("tiletune::rms_norm", (at,)), ("tiletune::rms_norm_backward", (at,))]
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(ours_x.grad, theirs_x.grad, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(model[0].weight.grad, reference.weight.grad, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("eps", [None, 1e-5], ids=["torchs-default", "1e-5"])
def test_a_patched_torch_rms_norm_compiles_whole_at_its_eps(eps: float | None) -> None:
    model, reference = patched_rms_norm_pair(eps)
    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(model, fullgraph=True, backend=counter)
    x = torch.randn(2, 5, 48) * 1e-3
    torch.testing.assert_close(compiled(x), reference(x), atol=1e-5, rtol=1e-4)
    assert counter.frame_count == 1
