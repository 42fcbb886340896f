"""``fused_attention_backward``, portable and native, against torch's autograd.

The truth is the gradient torch's autograd takes of the attention's forward in float64 (a plain
softmax attention whose output and log-sum-exp are both differentiated, so a given ``grad_lse``
counts), cross-checked with autograd of ``scaled_dot_product_attention``. The kernels get the
forward's ``out`` (in their dtype) and float32 ``lse``, as the operator saves them.

Covered: random shapes the blocks do not divide, causal 0, 1 (top-left) and 2 (bottom-right) with
``seq_q`` both below and above ``seq_kv``, grouped-query heads, additive masks broadcast over batch
or heads, rows that see no key, a gradient of the log-sum-exp, a custom scale, every ``buffer_num``
and ``pipeline_depth``, the native kernel's fused and two-pass schedules; float32 against the
float64 truth, float16 and bfloat16 within the tolerances below; bad inputs.

Tolerances (``atol``, ``rtol`` of each gradient, against the float64 truth of the same rounded
inputs): float32 ``2e-5``; float16 ``5e-3`` (its output and gradients rounded to 11 bits); bfloat16
``4e-2`` (8 bits). The largest errors seen were about a tenth (float32), two fifths (float16) and
half (bfloat16) of these.
"""

from __future__ import annotations

import random

import pytest
import torch

from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.device import cpu_chip
from tiletune.kernels.errors import ShapeError
from tiletune.kernels.fused_attention import formula as forward
from tiletune.kernels.fused_attention.formula import AttentionSaved
from tiletune.kernels.fused_attention.portable import SPEC as FORWARD
from tiletune.kernels.fused_attention_backward.formula import attention_backward
from tiletune.kernels.fused_attention_backward.native import SPEC as NATIVE
from tiletune.kernels.fused_attention_backward.portable import SPEC
from tiletune.kernels.native.build import native_status
from tiletune.kernels.pipeline import tracing

LIMITS = cpu_chip().limits
BACKENDS = ("torch", "native")
TOLERANCE = {torch.float32: (2e-5, 2e-5), torch.float16: (5e-3, 5e-3), torch.bfloat16: (4e-2, 4e-2)}
Gradients = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


@pytest.fixture(autouse=True)
def native_built() -> None:
    """Fail (not skip) with the reason when the extension is not built here."""
    status = native_status()
    if not status.available:
        pytest.fail(f"the native CPU backend is unavailable: {status.reason}")


def attention_shape(  # noqa: PLR0917  (a shape's dims, in their order)
    batch: int, heads: int, kv_heads: int, seq_q: int, seq_kv: int, head_dim: int, causal: int, mask: int
) -> Shape:
    """A full shape, every dim named."""
    return {
        "batch": batch,
        "heads": heads,
        "kv_heads": kv_heads,
        "seq_q": seq_q,
        "seq_kv": seq_kv,
        "head_dim": head_dim,
        "causal": causal,
        "mask": mask,
    }


def safe_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, *, causal: int, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, lse)`` written plainly, differentiable everywhere: a row without a visible key has
    ``out`` 0 and ``lse`` ``-inf`` and gradient 0 (no ``-inf - -inf``)."""
    heads = q.shape[1]
    s = q @ forward.grouped(k, heads).transpose(-2, -1) * scale
    if mask is not None:
        s = s + mask
    hidden = forward.causal_mask(q.shape[2], k.shape[2], causal, q.device)
    if hidden is not None:
        s = s.masked_fill(hidden, float("-inf"))
    top = s.amax(-1, keepdim=True).detach()
    top = torch.where(torch.isinf(top), torch.zeros_like(top), top)
    e = torch.exp(s - top)
    total = e.sum(-1, keepdim=True)
    out = (e / total.clamp_min(1e-300)) @ forward.grouped(v, heads)
    lse = (torch.log(total.clamp_min(1e-300)) + top).masked_fill(total == 0, float("-inf"))
    return out, lse.squeeze(-1)


class Case:
    """One problem: float64 master tensors, the kernel's inputs in ``dtype`` and the float64 truth."""

    def __init__(
        self,
        shape: Shape,
        dtype: torch.dtype,
        seed: int,
        *,
        mask: torch.Tensor | None = None,
        scale: float | None = None,
        with_grad_lse: bool = False,
    ) -> None:
        generator = torch.Generator().manual_seed(seed)
        b, h, hkv, sq, skv, d = (
            shape[n] for n in ("batch", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim")
        )
        q, grad = (torch.randn((b, h, sq, d), generator=generator).to(dtype) for _ in range(2))
        k, v = (torch.randn((b, hkv, skv, d), generator=generator).to(dtype) for _ in range(2))
        self.shape, self.scale = shape, scale
        self.mask = None if mask is None else mask.to(dtype)
        factor = forward.scale_of(d, scale)
        out, lse = forward.attention(q, k, v, mask=self.mask, causal=shape["causal"], scale=scale)
        self.grad_lse = torch.randn((b, h, sq), generator=generator) if with_grad_lse else None
        if self.grad_lse is not None:  # a row without a key has no lse to differentiate
            self.grad_lse = torch.where(torch.isneginf(lse), 0.0, self.grad_lse)
        extra = () if self.mask is None else (self.mask,)
        self.inputs = (q, k, v, out.to(dtype), lse.float(), grad, *extra)
        self.truth = self._truth(factor)

    def _truth(self, factor: float) -> Gradients:
        q, k, v = (t.double().requires_grad_() for t in self.inputs[:3])
        mask = None if self.mask is None else self.mask.double()
        out, lse = safe_attention(q, k, v, mask, causal=self.shape["causal"], scale=factor)
        outputs, grads = [out], [self.inputs[5].double()]
        if self.grad_lse is not None:
            outputs.append(lse)
            grads.append(self.grad_lse.double())
        dq, dk, dv = torch.autograd.grad(outputs, (q, k, v), grads)
        return dq, dk, dv

    def check(self, config: Config, backend: str) -> Gradients:
        """Run ``backend`` under ``config``; assert each gradient is the truth within tolerance."""
        got = SPEC.gradients(self.inputs, config, self.shape, backend, self.scale, self.grad_lse)
        atol, rtol = TOLERANCE[self.inputs[0].dtype]
        for name, value, want, like in zip(("dq", "dk", "dv"), got, self.truth, self.inputs[:3], strict=True):
            assert value.dtype == like.dtype, name
            assert value.shape == like.shape, name
            assert value.isfinite().all(), (name, config, backend)
            try:
                torch.testing.assert_close(value.double(), want, atol=atol, rtol=rtol)
            except AssertionError as error:
                raise AssertionError(f"{name} {backend} {self.shape} {config}: {error}") from None
        return got


def random_mask(shape: Shape, generator: torch.Generator, batch: int, heads: int) -> torch.Tensor:
    """An additive mask ``[batch or 1, heads or 1, seq_q, seq_kv]``: normal, ``-inf`` on about a
    fifth of the pairs and on every key of query 0 (a row that sees no key)."""
    size = (batch, heads, shape["seq_q"], shape["seq_kv"])
    bias = torch.randn(size, generator=generator, dtype=torch.float64)
    bias = bias.masked_fill(torch.rand(size, generator=generator, dtype=torch.float64) < 0.2, float("-inf"))
    bias[:, :, 0] = float("-inf")
    return bias


def random_case(seed: int, dtype: torch.dtype = torch.float32) -> Case:
    """A random shape (lengths the blocks rarely divide), causal alignment, grouping and mask."""
    rng = random.Random(seed)
    heads = rng.choice((1, 2, 4))
    kv_heads = rng.choice([n for n in (1, 2, 4) if heads % n == 0])
    shape = attention_shape(
        rng.randint(1, 2),
        heads,
        kv_heads,
        rng.randint(1, 90),
        rng.randint(1, 90),
        rng.choice((4, 8, 16, 24)),
        rng.choice((0, 1, 2)),
        rng.randint(0, 1),
    )
    mask = None
    if shape["mask"]:
        generator = torch.Generator().manual_seed(seed)
        mask = random_mask(shape, generator, rng.choice((1, shape["batch"])), rng.choice((1, heads)))
    return Case(shape, dtype, seed, mask=mask, with_grad_lse=rng.random() < 0.5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", range(10))
def test_random_shapes_and_configs_match_autograd_in_float32(seed: int, backend: str) -> None:
    case = random_case(seed)
    space = SPEC.space(case.shape, "float32", LIMITS)
    for config in random.Random(seed).sample(space, min(3, len(space))):
        case.check(config, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal", [0, 1, 2])
@pytest.mark.parametrize(("seq_q", "seq_kv"), [(45, 45), (23, 61), (61, 23)])
def test_causal_alignments_and_lengths(causal: int, seq_q: int, seq_kv: int, backend: str) -> None:
    case = Case(attention_shape(2, 4, 2, seq_q, seq_kv, 16, causal, 0), torch.float32, 1)
    dq, dk, _ = case.check({"block_q": 16, "block_kv": 32, "buffer_num": 2, "pipeline_depth": 2}, backend)
    if causal == 2 and seq_q > seq_kv:  # the first seq_q - seq_kv queries see no key
        assert (dq[:, :, : seq_q - seq_kv] == 0).all()
    if causal == 1 and seq_kv > seq_q:  # no query sees the keys past seq_q
        assert (dk[:, :, seq_q:] == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_buffer_num_and_pipeline_depth(backend: str) -> None:
    generator = torch.Generator().manual_seed(4)
    shape = attention_shape(2, 4, 2, 37, 53, 8, 2, 1)
    case = Case(shape, torch.float32, 4, mask=random_mask(shape, generator, 2, 1), with_grad_lse=True)
    for buffers in (1, 2, 3, 4):
        for depth in (1, 2, 3):
            if depth > 1 and buffers < 2:
                continue
            case.check(
                {"block_q": 16, "block_kv": 8, "buffer_num": buffers, "pipeline_depth": depth}, backend
            )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_low_precision_within_the_stated_tolerance(dtype: torch.dtype, backend: str) -> None:
    for seed in (2, 5, 7):
        case = random_case(seed, dtype)
        space = SPEC.space(case.shape, "float16", LIMITS)
        for config in random.Random(seed).sample(space, min(2, len(space))):
            case.check(config, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rows_that_see_no_key_get_zero_gradients(backend: str) -> None:
    generator = torch.Generator().manual_seed(8)
    shape = attention_shape(2, 2, 1, 30, 41, 8, 0, 1)
    mask = random_mask(shape, generator, 1, 2)
    mask[:, :, :, 40] = float("-inf")  # nobody sees the last key
    case = Case(shape, torch.float32, 8, mask=mask, with_grad_lse=True)
    dq, dk, dv = case.check({"block_q": 8, "block_kv": 16, "buffer_num": 3, "pipeline_depth": 3}, backend)
    assert (dq[:, :, 0] == 0).all()
    assert (dk[:, :, 40] == 0).all()
    assert (dv[:, :, 40] == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_custom_scale(backend: str) -> None:
    case = Case(attention_shape(1, 2, 2, 19, 27, 16, 1, 0), torch.float32, 9, scale=0.37)
    case.check({"block_q": 16, "block_kv": 16, "buffer_num": 2, "pipeline_depth": 3}, backend)


@pytest.mark.parametrize("causal", [1, 2])
def test_gradients_are_torch_sdpa_s(causal: int) -> None:
    """Autograd of ``scaled_dot_product_attention`` (GQA; top-left ``is_causal``, bottom-right as a
    boolean mask) gives what the kernels give."""
    case = Case(attention_shape(1, 4, 2, 24, 40, 16, causal, 0), torch.float32, 10)
    q, k, v = (t.double().requires_grad_() for t in case.inputs[:3])
    visible = torch.ones(24, 40, dtype=torch.bool).tril(40 - 24)
    attend = torch.nn.functional.scaled_dot_product_attention
    out = (
        attend(q, k, v, is_causal=True, enable_gqa=True)
        if causal == 1
        else attend(q, k, v, attn_mask=visible, enable_gqa=True)
    )
    sdpa = torch.autograd.grad(out, (q, k, v), case.inputs[5].double())
    for backend in BACKENDS:
        got = SPEC.gradients(
            case.inputs,
            {"block_q": 8, "block_kv": 16, "buffer_num": 2, "pipeline_depth": 2},
            case.shape,
            backend,
        )
        for value, want in zip(got, sdpa, strict=True):
            torch.testing.assert_close(value.double(), want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize(("batch", "kv_heads", "block_dim"), [(1, 1, 1), (1, 1, 2), (3, 1, 2), (2, 2, 4)])
def test_the_native_fused_and_two_pass_schedules_agree(batch: int, kv_heads: int, block_dim: int) -> None:
    """One (batch, kv head) unit on 2 cores runs two passes; 1 core, 3 units on 2, 4 on 4: fused."""
    case = Case(attention_shape(batch, 4, kv_heads, 33, 47, 8, 1, 0), torch.float32, 11, with_grad_lse=True)
    case.check(
        {"block_q": 8, "block_kv": 16, "block_dim": block_dim, "buffer_num": 2, "pipeline_depth": 2}, "native"
    )
    case = Case(attention_shape(batch, 4, kv_heads, 33, 47, 8, 1, 0), torch.bfloat16, 11)
    case.check(
        {"block_q": 8, "block_kv": 16, "block_dim": block_dim, "buffer_num": 3, "pipeline_depth": 3}, "native"
    )


def test_the_portable_pipeline_rotates_buffer_num_slots_and_skips_causal_blocks() -> None:
    case = Case(attention_shape(1, 2, 2, 40, 40, 8, 1, 0), torch.float32, 12)
    counts = {}
    for buffers in (2, 3):
        with tracing() as trace:
            SPEC.gradients(
                case.inputs,
                {"block_q": 8, "block_kv": 8, "buffer_num": buffers, "pipeline_depth": 2},
                case.shape,
            )
        assert {event.slot for event in trace.of("copy_in")} == set(range(buffers))
        counts[buffers] = len(trace.of("compute"))
        assert trace.max_in_flight <= 2
    # causal top-left, 5 x 5 blocks: each pass visits the 15 pairs on and below the diagonal
    assert counts == {2: 30, 3: 30}


def test_the_spec_reads_shapes_and_refuses_bad_inputs() -> None:
    shape = attention_shape(2, 4, 2, 9, 11, 8, 0, 1)
    inputs = SPEC.make_inputs(shape, "float32", torch.device("cpu"))
    assert SPEC.shape_of(inputs) == {**shape, "causal": 0}
    q, k, v, out, lse, grad, mask = inputs
    bad = {
        "out": (q, k, v, out[:, :, :5], lse, grad, mask),
        "lse": (q, k, v, out, lse.double(), grad, mask),
        "grad_out": (q, k, v, out, lse, grad.half(), mask),
        "mask": (q, k, v, out, lse, grad, mask[:, :, :3]),
        "k": (q, k[..., :4], v, out, lse, grad, mask),
    }
    for name, tensors in bad.items():
        with pytest.raises(ShapeError) as caught:
            SPEC.shape_of(tensors)
        assert caught.value.field == f"inputs.{name}"
    with pytest.raises(ShapeError, match="takes 6 tensor"):
        SPEC.shape_of(inputs[:5])
    config = SPEC.default_config(shape, "float32", LIMITS)
    for backend in BACKENDS:
        with pytest.raises(ValueError, match="takes 7 inputs"):
            SPEC.gradients(inputs[:6], config, shape, backend)
    with pytest.raises(RuntimeError, match="buffer_num must be >= 1"):
        NATIVE.run(inputs, {**config, "block_dim": 1, "buffer_num": 0}, shape)


def test_the_reference_is_the_formula_and_make_inputs_the_forward_s() -> None:
    shape = attention_shape(1, 2, 1, 13, 17, 8, 2, 1)
    q, k, v, out, lse, _, mask = SPEC.make_inputs(shape, "float32", torch.device("cpu"), seed=3)
    want_out, want_lse = forward.attention(q, k, v, mask=mask, causal=2)
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(lse, want_lse)
    case = Case(shape, torch.float32, 3, mask=mask.double())
    for value, want in zip(SPEC.reference(case.inputs, shape), case.truth, strict=True):
        torch.testing.assert_close(value.double(), want, atol=1e-5, rtol=1e-5)


def test_the_formula_s_mask_gradient_is_autograd_s() -> None:
    """``attention_backward(..., mask_grad=True)`` (what the operator calls for a mask that learns)
    gives the gradient of a mask broadcast over heads, summed over them."""
    shape = attention_shape(2, 4, 2, 11, 13, 8, 2, 1)
    generator = torch.Generator().manual_seed(13)
    case = Case(shape, torch.float64, 13, mask=random_mask(shape, generator, 2, 1))
    q, k, v, out, lse, grad, mask = case.inputs
    mask = mask.clone().requires_grad_()
    result, _ = safe_attention(q, k, v, mask, causal=2, scale=8**-0.5)
    (want,) = torch.autograd.grad(result, (mask,), grad)
    saved = AttentionSaved(q, k, v, mask.detach(), out, lse, 2, None)
    *gradients, dmask = attention_backward(saved, grad, None, mask_grad=True)
    assert dmask is not None
    assert dmask.shape == mask.shape
    # (the saved lse is float32, as the operator's)
    torch.testing.assert_close(dmask, want, atol=1e-6, rtol=1e-5)
    for value, truth in zip(gradients, case.truth, strict=True):
        torch.testing.assert_close(value, truth, atol=1e-6, rtol=1e-5)


def test_the_declaration_counts_the_forward_s_dims() -> None:
    shape = SPEC.parse_shape(
        {"batch": 1, "heads": 8, "kv_heads": 2, "seq_q": 2048, "seq_kv": 2048, "head_dim": 64, "causal": 1}
    )
    assert [d.name for d in SPEC.dims] == [d.name for d in FORWARD.dims]
    assert SPEC.backward_kernel is None
    assert SPEC.flops(shape) == 10 * 8 * 64 * (2048 * 2049 // 2)
    assert SPEC.flops({**shape, "causal": 0}) == 10 * 8 * 64 * 2048 * 2048
    tensors = SPEC.tensor_bytes(shape, "bfloat16")
    assert sorted(tensors) == ["dk", "dq", "dv", "grad_out", "k", "lse", "out", "q", "v"]
    assert tensors["dq"] == tensors["q"] == 8 * 2048 * 64 * 2
    assert tensors["dk"] == tensors["k"] == 2 * 2048 * 64 * 2
    assert SPEC.bytes_moved(shape, "bfloat16") == sum(tensors.values())
    assert SPEC.default_config(shape, "float32", LIMITS) == FORWARD.default_config(shape, "float32", LIMITS)
    with pytest.raises(ShapeError, match="must divide heads"):
        SPEC.parse_shape({**shape, "kv_heads": 3})
    config = {"block_q": 64, "block_kv": 128, "buffer_num": 2, "pipeline_depth": 2}
    more = {**config, "buffer_num": 3}
    assert SPEC.working_set_bytes(more, shape, "float32") > SPEC.working_set_bytes(config, shape, "float32")
    assert SPEC.working_set_bytes(config, {**shape, "mask": 1}, "float32") > SPEC.working_set_bytes(
        config, shape, "float32"
    )
    # pass 1: 2 kv heads x 16 kv blocks; pass 2: 8 heads x 32 q blocks
    assert NATIVE.tile_count({**config, "block_dim": 1}, shape) == 256
    assert "exceeds the 256 tile(s)" in (
        NATIVE.invalid_reason({**config, "block_dim": 512}, shape, "float32", LIMITS) or ""
    )
