"""``tiletune.nn.functional``: torch's signatures and results, on tiletune's operators where they
cover the call, torch's own function (logged once) where they do not."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from torch.nn import functional as torch_functional

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


def test_calls_the_operator_does_not_cover_run_torchs_function_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    q, k, v = attention_inputs(4, 4, 9, 13)
    mask = torch.rand(9, 13) > 0.3
    caplog.set_level(logging.INFO, logger="tiletune.nn.functional")
    cases: list[dict[str, Any]] = [
        {"attn_mask": mask},
        {"attn_mask": mask.float().log()},  # an additive mask
        {"is_causal": True},  # seq_q != seq_kv: SDPA aligns causal bottom-right
    ]
    for case in cases * 2:
        ours = functional.scaled_dot_product_attention(q, k, v, **case)
        torch.testing.assert_close(ours, torch_functional.scaled_dot_product_attention(q, k, v, **case))
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2, lines  # one line per reason, however many calls
    assert any("attn_mask" in line for line in lines)
    assert any("bottom-right" in line for line in lines)


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
