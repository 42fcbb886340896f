"""``tiletune.nn.functional``: torch's signatures and results, on tiletune's operators where they
cover the call, torch's own function (logged once) where they do not."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.nn import functional as torch_functional
from torch.nn.attention.bias import causal_lower_right, causal_upper_left
from torch.profiler import profile

from tiletune.nn import functional

#: float32 through the kernels against torch's ops: forward and gradients.
ATOL = 1e-5


def attention_inputs(heads: int, kv_heads: int, seq_q: int, seq_kv: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(0)
    sizes = ((2, heads, seq_q, 16), (2, kv_heads, seq_kv, 16), (2, kv_heads, seq_kv, 16))
    return tuple(torch.randn(size, generator=generator).requires_grad_() for size in sizes)


def assert_same_with_gradients(
    ours: torch.Tensor, theirs: torch.Tensor, inputs: tuple[torch.Tensor, ...]
) -> None:
    grad = torch.randn_like(ours)
    for mine, reference in zip(
        torch.autograd.grad(ours, inputs, grad), torch.autograd.grad(theirs, inputs, grad), strict=True
    ):
        torch.testing.assert_close(mine, reference, atol=ATOL, rtol=1e-4)
    torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=1e-4)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "seq_q", "seq_kv", "causal", "scale"),
    [
        (4, 4, 33, 33, True, None),
        (4, 4, 17, 45, False, None),
        (8, 2, 33, 33, True, 0.3),  # grouped-query attention, a scale of its own
        (8, 1, 20, 29, False, None),  # multi-query attention
    ],
)
def test_attention_on_the_operator_matches_torch(  # noqa: PLR0917  (the parameters of a case)
    heads: int, kv_heads: int, seq_q: int, seq_kv: int, causal: bool, scale: float | None
) -> None:
    q, k, v = attention_inputs(heads, kv_heads, seq_q, seq_kv)
    gqa = heads != kv_heads
    ours = functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=gqa)
    theirs = torch_functional.scaled_dot_product_attention(
        q, k, v, is_causal=causal, scale=scale, enable_gqa=gqa
    )

    assert ours.grad_fn is not None
    assert_same_with_gradients(ours, theirs, (q, k, v))


def padding(seq_q: int, seq_kv: int) -> torch.Tensor:
    """A boolean ``[2, 1, seq_q, seq_kv]`` mask (True: attend): the first sequence's first 4 keys
    are padding, the second sees every key."""
    mask = torch.ones(2, 1, seq_q, seq_kv, dtype=torch.bool)
    mask[0, :, :, :4] = False
    return mask


#: Masks SDPA takes, each on the operator: ``(name, attn_mask for (seq_q, seq_kv), kv heads)``.
MASKS: list[tuple[str, Callable[[int, int], Any], int]] = [
    ("boolean", padding, 4),
    ("additive", lambda q, kv: torch.randn(q, kv, generator=torch.Generator().manual_seed(2)), 4),
    ("boolean-gqa", padding, 2),
    ("additive-from-boolean", lambda q, kv: torch.zeros(()).masked_fill(~padding(q, kv), -math.inf), 1),
    ("causal-lower-right", causal_lower_right, 4),
    ("causal-upper-left", causal_upper_left, 4),
]


@pytest.mark.usefixtures("tiled_answers")
@pytest.mark.parametrize(("seq_q", "seq_kv"), [(9, 13), (13, 13)])
@pytest.mark.parametrize(("name", "make_mask", "kv_heads"), MASKS, ids=[m[0] for m in MASKS])
def test_masked_attention_runs_the_operator_as_torch_does(
    name: str, make_mask: Callable[[int, int], Any], kv_heads: int, seq_q: int, seq_kv: int
) -> None:
    q, k, v = attention_inputs(4, kv_heads, seq_q, seq_kv)
    mask = make_mask(seq_q, seq_kv)
    gqa = kv_heads != 4
    with profile() as trace:
        ours = functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
    assert "tiletune::fused_attention" in {event.name for event in trace.events()}
    theirs = torch_functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
    assert_same_with_gradients(ours, theirs, (q, k, v))


def test_is_causal_between_sequences_of_different_lengths_is_top_left_as_torchs() -> None:
    """torch's ``is_causal`` aligns top-left whatever the lengths (its documentation: the upper-left
    causal bias when the mask is not square); the operator's ``causal=1`` does the same."""
    q, k, v = attention_inputs(4, 4, 9, 13)
    ours = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    theirs = torch_functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert_same_with_gradients(ours, theirs, (q, k, v))


def test_calls_the_operator_does_not_cover_run_torchs_function_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    q, k, v = attention_inputs(4, 4, 9, 13)
    wide_v = torch.randn(2, 4, 13, 24)  # another head_dim for the values
    caplog.set_level(logging.INFO, logger="tiletune.nn.functional")
    for _ in range(2):
        for value, dropout_p in ((v, 0.5), (wide_v, 0.0)):
            torch.manual_seed(3)
            ours = functional.scaled_dot_product_attention(q, k, value, dropout_p=dropout_p)
            torch.manual_seed(3)
            theirs = torch_functional.scaled_dot_product_attention(q, k, value, dropout_p=dropout_p)
            torch.testing.assert_close(ours, theirs)
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2, lines  # one line per reason, however many calls
    assert any("dropout" in line for line in lines)
    assert any("head_dim" in line for line in lines)


def test_rms_norm_and_linear_match_torch_with_gradients() -> None:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(3, 7, 48, generator=generator).requires_grad_()
    weight = (torch.rand(48, generator=generator) + 0.5).requires_grad_()
    ours = functional.rms_norm(x, weight, 1e-6)
    assert_same_with_gradients(ours, torch_functional.rms_norm(x, (48,), weight, 1e-6), (x, weight))

    matrix = torch.randn(20, 48, generator=generator).requires_grad_()
    bias = torch.randn(20, generator=generator).requires_grad_()
    ours = functional.linear(x, matrix, bias)
    assert_same_with_gradients(ours, torch_functional.linear(x, matrix, bias), (x, matrix, bias))


def tiletune_operators(fn: Callable[[], Any]) -> set[str]:
    """The ``tiletune::`` operators a call of ``fn`` runs, its backward included."""
    with profile() as trace:
        fn()
    return {event.name for event in trace.events() if event.name.startswith("tiletune::")}


@pytest.mark.parametrize("eps", [1e-5, None, 0.1], ids=["1e-5", "finfo", "0.1"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rms_norm_runs_the_operator_at_any_eps_as_torch_computes_it(
    eps: float | None, dtype: torch.dtype
) -> None:
    """``eps`` is the operator's argument (``None``: the dtype's machine epsilon, as torch's); ``x`` of
    magnitude 1e-3 makes ``mean(x^2)`` about 1e-6, so that each eps moves the result."""
    generator = torch.Generator().manual_seed(2)
    x = (torch.randn(3, 7, 48, generator=generator, dtype=dtype) * 1e-3).requires_grad_()
    weight = (torch.rand(48, generator=generator, dtype=dtype) + 0.5).requires_grad_()

    def both() -> tuple[torch.Tensor, torch.Tensor]:
        return functional.rms_norm(x, weight, eps), torch_functional.rms_norm(x, (48,), weight, eps)

    assert tiletune_operators(lambda: torch.autograd.backward(both()[0].sum())) == {
        "tiletune::rms_norm",
        "tiletune::rms_norm_backward",
    }
    assert_same_with_gradients(*both(), (x, weight))


def test_rms_norm_with_a_weight_of_another_dtype_runs_torchs() -> None:
    x, weight = torch.randn(4, 16, dtype=torch.bfloat16), torch.rand(16) + 0.5
    assert tiletune_operators(lambda: functional.rms_norm(x, weight, 1e-5)) == set()
    torch.testing.assert_close(
        functional.rms_norm(x, weight, 1e-5), torch_functional.rms_norm(x, (16,), weight, 1e-5)
    )


def test_a_linear_weights_gradient_comes_in_the_weights_layout_with_no_copy() -> None:
    """``linear`` multiplies by ``weight.t()``: its backward makes the weight's gradient in the
    weight's own (contiguous) layout, as eager's ``linear`` does, so autograd copies nothing into
    ``.grad`` (the profile of the backward holds no ``aten::copy_``), and its values are torch's."""
    x = torch.randn(64, 32, requires_grad=True)
    weight = torch.randn(48, 32, requires_grad=True)
    output = functional.linear(x, weight)
    upstream = torch.randn_like(output)  # as the next layer hands it back: contiguous
    with profile() as backward:
        torch.autograd.backward(output, upstream)
    assert weight.grad is not None
    assert weight.grad.is_contiguous()
    assert "aten::copy_" not in {event.key for event in backward.key_averages()}
    x_torch, weight_torch = x.detach().requires_grad_(), weight.detach().requires_grad_()
    torch.autograd.backward(torch_functional.linear(x_torch, weight_torch), upstream)
    torch.testing.assert_close(weight.grad, weight_torch.grad)
    torch.testing.assert_close(x.grad, x_torch.grad)
