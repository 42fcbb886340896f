"""``tiletune.nn.patch``: a plain ``torch.nn`` model runs on tiletune's operators, unchanged in its code
and its results, eagerly and under ``torch.compile(fullgraph=True)``."""

from __future__ import annotations

import pickle

import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounter
from torch.nn import functional as torch_functional
from torch.profiler import profile

import tiletune
import tiletune.nn
from tiletune.nn import Linear, RMSNorm


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


def test_a_patched_model_pickles_whole_and_loads_patched() -> None:
    """``torch.save(model)`` of a patched model: it loads with tiletune's layers and forward."""
    model, reference = patched_pair()
    loaded = pickle.loads(pickle.dumps(model))
    x = torch.randn(1, 20, 64)
    torch.testing.assert_close(loaded(x), reference(x), atol=1e-5, rtol=1e-4)
    with profile() as trace:
        loaded(x)
    assert "tiletune::fused_attention" in {event.name for event in trace.events()}
    assert tiletune.patch(loaded) is loaded  # patching again changes nothing
    assert type(loaded.norm) is RMSNorm
