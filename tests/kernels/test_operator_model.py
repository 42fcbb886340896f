"""A small Llama-style decoder trains the same on tiletune's operators as on torch's ops, eager and
under ``torch.compile``: same initial parameters, same batches, same losses and parameters each step."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import pytest
import torch
from torch import Tensor, nn
from torch._dynamo.testing import CompileCounterWithBackend
from torch.nn import functional

from tiletune.kernels.device import cpu_chip
from tiletune.kernels.ops import using_source
from tiletune.kernels.registry import get_kernel

VOCAB, HIDDEN, HEADS, LAYERS, MLP_HIDDEN = 50, 32, 4, 2, 64
BATCH, SEQ = 2, 24
EPS = 1e-6
STEPS, LEARNING_RATE = 4, 0.3
#: Losses and parameters of the two copies after each step: measured within 5e-7 (losses, ~4) and
#: 1.2e-7 (parameters), set with margin.
ATOL, RTOL = 1e-5, 1e-5


@dataclass(frozen=True)
class Ops:
    """What a decoder computes with: causal attention over ``[batch, heads, seq, head_dim]``, the
    RMS norm of the last dim times a weight, and ``x @ weight^T`` over the last dim."""

    attention: Callable[[Tensor, Tensor, Tensor], Tensor]
    rms_norm: Callable[[Tensor, Tensor], Tensor]
    linear: Callable[[Tensor, Tensor], Tensor]


def torch_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    return functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def torch_rms_norm(x: Tensor, weight: Tensor) -> Tensor:
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + EPS) * weight


def torch_linear(x: Tensor, weight: Tensor) -> Tensor:
    return x @ weight.T


def tiletune_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    out: Tensor = torch.ops.tiletune.fused_attention(q, k, v, causal=1)[0]
    return out


def tiletune_rms_norm(x: Tensor, weight: Tensor) -> Tensor:
    out: Tensor = torch.ops.tiletune.rms_norm(x, weight)
    return out


def tiletune_linear(x: Tensor, weight: Tensor) -> Tensor:
    """The matmul operator on the 2-D view of ``x``."""
    out: Tensor = torch.ops.tiletune.matmul(x.reshape(-1, x.shape[-1]), weight.T)
    return out.view(*x.shape[:-1], weight.shape[0])


TORCH_OPS = Ops(torch_attention, torch_rms_norm, torch_linear)
TILETUNE_OPS = Ops(tiletune_attention, tiletune_rms_norm, tiletune_linear)


def projection(inputs: int, outputs: int) -> nn.Parameter:
    """A ``[outputs, inputs]`` weight, initialised as ``nn.Linear`` does."""
    return nn.Parameter(nn.Linear(inputs, outputs, bias=False).weight.detach().clone())


def norm_weight() -> nn.Parameter:
    """An RMS norm's weight: near 1, not all equal (so its gradient is not symmetric)."""
    return nn.Parameter(1.0 + 0.1 * torch.randn(HIDDEN))


class Block(nn.Module):
    """RMS norm → attention → residual; RMS norm → MLP (SiLU) → residual."""

    def __init__(self) -> None:
        super().__init__()
        self.attention_norm = norm_weight()
        self.q, self.k, self.v, self.o = (projection(HIDDEN, HIDDEN) for _ in range(4))
        self.mlp_norm = norm_weight()
        self.up, self.down = projection(HIDDEN, MLP_HIDDEN), projection(MLP_HIDDEN, HIDDEN)

    def forward(self, x: Tensor, ops: Ops) -> Tensor:
        batch, seq, _ = x.shape
        h = ops.rms_norm(x, self.attention_norm)

        def heads(weight: Tensor) -> Tensor:
            return ops.linear(h, weight).view(batch, seq, HEADS, HIDDEN // HEADS).transpose(1, 2)

        attended = ops.attention(heads(self.q), heads(self.k), heads(self.v))
        x = x + ops.linear(attended.transpose(1, 2).reshape(batch, seq, HIDDEN), self.o)
        return x + ops.linear(functional.silu(ops.linear(ops.rms_norm(x, self.mlp_norm), self.up)), self.down)


class Decoder(nn.Module):
    """Embedding, :data:`LAYERS` blocks, a final RMS norm and the LM head, on ``ops``."""

    def __init__(self, ops: Ops) -> None:
        super().__init__()
        self.ops = ops
        self.embedding = nn.Embedding(VOCAB, HIDDEN)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = norm_weight()
        self.head = projection(HIDDEN, VOCAB)

    def forward(self, tokens: Tensor) -> Tensor:
        x = self.embedding(tokens)
        for block in self.blocks:
            x = block(x, self.ops)
        return self.ops.linear(self.ops.rms_norm(x, self.norm), self.head)


def next_token_loss(model: nn.Module, tokens: Tensor) -> Tensor:
    """Cross-entropy of each token's logits against the next token."""
    logits = model(tokens[:, :-1])
    return functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def twins(first: Ops, second: Ops) -> tuple[Decoder, Decoder]:
    """Two decoders with the same parameters, one on each of ``first`` and ``second``."""
    torch.manual_seed(0)
    a = Decoder(first)
    b = Decoder(second)
    b.load_state_dict(a.state_dict())
    return a, b


def batches() -> list[Tensor]:
    """The training batches: one batch of ``SEQ + 1`` random tokens (inputs and next-token targets)
    :data:`STEPS` times, so the loss falls at every step."""
    tokens = torch.randint(VOCAB, (BATCH, SEQ + 1), generator=torch.Generator().manual_seed(1))
    return [tokens] * STEPS


def train_step(model: nn.Module, loss_fn: Callable[[nn.Module, Tensor], Tensor], tokens: Tensor) -> Tensor:
    """One SGD step; returns the loss before it."""
    model.zero_grad()
    loss = loss_fn(model, tokens)
    torch.autograd.backward(loss)
    with torch.no_grad():
        for parameter in model.parameters():
            assert parameter.grad is not None
            parameter.sub_(LEARNING_RATE * parameter.grad)
    return loss.detach()


def assert_same_parameters(got: nn.Module, expected: nn.Module, step: int) -> None:
    """Every parameter of ``got`` is ``expected``'s of its name, within the tolerance."""
    expected_parameters = dict(expected.named_parameters())
    got_parameters = dict(got.named_parameters())
    assert got_parameters.keys() == expected_parameters.keys()
    for name, parameter in got_parameters.items():
        try:
            torch.testing.assert_close(parameter, expected_parameters[name], atol=ATOL, rtol=RTOL)
        except AssertionError as error:
            raise AssertionError(f"{name} after step {step}: {error}") from None


@dataclass(frozen=True)
class Answer:
    config: Mapping[str, int]


@dataclass
class KernelLog:
    """A config source that answers the kernels' default rule and records the kernels asked."""

    kernels: list[str] = field(default_factory=list)

    def get(self, kernel: str, shape: Mapping[str, int], /, *, dtype: str) -> Answer:
        self.kernels.append(kernel)
        return Answer(get_kernel(kernel).default_config(dict(shape), dtype, cpu_chip().limits))


def test_the_twins_start_alike_and_only_the_tiletune_one_runs_the_operators() -> None:
    reference, tiled = twins(TORCH_OPS, TILETUNE_OPS)
    assert_same_parameters(tiled, reference, 0)
    tokens = batches()[0]
    reference_log, tiled_log = KernelLog(), KernelLog()
    with using_source(reference_log):
        expected = reference(tokens)
    with using_source(tiled_log):
        got = tiled(tokens)
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=RTOL)
    assert reference_log.kernels == []
    per_block = ["rms_norm", *["matmul"] * 3, "fused_attention", "matmul", "rms_norm", "matmul", "matmul"]
    assert tiled_log.kernels == [*per_block * LAYERS, "rms_norm", "matmul"]


def test_the_decoder_trains_the_same_on_tiletune_as_on_torch() -> None:
    reference, tiled = twins(TORCH_OPS, TILETUNE_OPS)
    losses = []
    for step, tokens in enumerate(batches()):
        expected = train_step(reference, next_token_loss, tokens)
        got = train_step(tiled, next_token_loss, tokens)
        torch.testing.assert_close(got, expected, atol=ATOL, rtol=RTOL)
        assert_same_parameters(tiled, reference, step)
        losses.append(float(got))
    assert losses == sorted(losses, reverse=True)  # it learns the batch
    assert losses[-1] < losses[0] - 0.1


@pytest.mark.usefixtures("fresh_dynamo")
def test_the_compiled_tiletune_decoder_trains_in_one_graph_like_eager() -> None:
    """Compiled by AOT autograd (the operators' fakes and backwards traced into the joint graph that
    inductor gets); inductor's own run of the operators, forward and backward, is in
    ``test_operators.py`` (building a whole model's C++ takes about a minute on two cores)."""
    eager, compiled_model = twins(TILETUNE_OPS, TILETUNE_OPS)
    counter = CompileCounterWithBackend("aot_eager")
    compiled_loss = torch.compile(next_token_loss, fullgraph=True, backend=counter)
    for step, tokens in enumerate(batches()):
        expected = train_step(eager, next_token_loss, tokens)
        got = train_step(compiled_model, compiled_loss, tokens)
        torch.testing.assert_close(got, expected, atol=ATOL, rtol=RTOL)
        assert_same_parameters(compiled_model, eager, step)
    assert counter.frame_count == 1
    ops = {node.target for graph in counter.graphs for node in graph.graph.nodes}
    tiletune = torch.ops.tiletune
    assert {tiletune.fused_attention, tiletune.rms_norm, tiletune.matmul} <= {
        getattr(op, "overloadpacket", op) for op in ops
    }
