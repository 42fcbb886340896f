"""torch's own op as every built-in family's vendor config: in the space, checked and timed by the
bench like a config, chosen and launched by the operators (and run for a key nobody tuned)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pytest
import torch
from torch.nn import functional

from tests.kernels.cases import SHAPES
from tiletune.client.space import VENDOR_CONFIG, Knob, is_vendor
from tiletune.kernels import all_declarations, select_config
from tiletune.kernels.device import cpu_chip, get_device
from tiletune.kernels.errors import ConfigError, DeviceUnavailableError
from tiletune.kernels.ops import using_source
from tiletune.kernels.registry import get_kernel
from tiletune.kernels.vendor import run_config, vendor_op
from tiletune.tuner.measure.bench import BenchSettings, KernelBench

LIMITS = cpu_chip().limits
OPS = torch.ops.tiletune
#: The built-in families, each with torch's op as an implementation.
FAMILIES = tuple(SHAPES)


@dataclass(frozen=True)
class Answer:
    """A config source's answer: the config and how it matched the key."""

    config: Mapping[str, int]
    match: str


@dataclass
class FixedSource:
    """A config source answering every key with one config and one match."""

    config: Mapping[str, int]
    match: str = "exact"

    def get(self, kernel: str, shape: Mapping[str, int], /, *, dtype: str) -> Answer:
        """The fixed answer, whatever the key."""
        return Answer(self.config, self.match)


def test_every_built_in_family_and_its_twins_declare_torch_op() -> None:
    declared = all_declarations()
    for family in FAMILIES:
        for name in (family, f"native_{family}", f"triton_{family}"):
            assert declared[name].has_vendor, name
    assert not declared["compiled_matmul"].has_vendor


def test_the_vendor_config_is_a_config_of_kernels_that_have_torch_op_only() -> None:
    rms_norm, compiled = get_kernel("rms_norm"), get_kernel("compiled_matmul")
    shape = {"rows": 8, "cols": 64}
    assert rms_norm.parse_config(dict(VENDOR_CONFIG), shape, LIMITS) == {"vendor": 1}
    assert rms_norm.config_problem({"vendor": 1}, shape, "float32", LIMITS) is None
    assert {"vendor": 1} not in rms_norm.space(shape, "float32", LIMITS)  # the search explores tiles
    with pytest.raises(ConfigError) as refused:
        compiled.parse_config({"vendor": 1}, {"m": 8, "n": 8, "k": 8}, LIMITS)
    assert refused.value.field == "config"
    problem = compiled.config_problem({"vendor": 1}, {"m": 8, "n": 8, "k": 8}, "float32", LIMITS)
    assert problem is not None
    assert "no vendor implementation" in problem


def test_no_knob_may_take_the_vendor_config_marker() -> None:
    with pytest.raises(ValueError, match="vendor"):
        Knob("vendor", (1, 2), "a knob named like the vendor config's marker")


@pytest.mark.parametrize("family", FAMILIES)
def test_the_bench_checks_and_times_torch_op_as_a_config(family: str) -> None:
    spec = get_kernel(family)
    shapes = [spec.parse_shape(raw) for raw in SHAPES[family]]
    with_op = [shape for shape in shapes if vendor_op(spec, shape, "cpu") is not None]
    assert len(with_op) >= 2  # bottom-right causal attention of unequal lengths has none (below)
    for shape in with_op:
        bench = KernelBench(spec, shape, "float32", get_device("cpu"), settings=BenchSettings(budget_s=0.01))
        assert bench.check({"vendor": 1}) is None, (family, shape)  # torch's op gives the reference's result
        result = bench.evaluate({"vendor": 1})
        assert result.measurement is not None, result


def test_torch_has_no_op_for_bottom_right_causal_attention_of_unequal_lengths() -> None:
    spec = get_kernel("fused_attention")
    shape = spec.parse_shape(
        {"batch": 1, "heads": 2, "seq_q": 16, "seq_kv": 24, "head_dim": 8, "causal": 2, "mask": 0}
    )
    assert vendor_op(spec, shape, "cpu") is None
    assert vendor_op(spec, {**shape, "seq_kv": 16}, "cpu") is not None
    assert vendor_op(spec, {**shape, "causal": 1}, "cuda") is None  # its log-sum-exp is torch's CPU op's
    bench = KernelBench(spec, shape, "float32", get_device("cpu"))
    failed = bench.check({"vendor": 1})
    assert failed is not None
    assert failed.error is not None
    assert "torch has no op" in failed.error
    with pytest.raises(DeviceUnavailableError):
        run_config(spec, bench.inputs, {"vendor": 1}, shape, "torch")


def _rms_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    return torch.randn(37, 300, generator=generator), torch.rand(300, generator=generator) + 0.5


def test_an_untuned_operator_call_runs_torch_op() -> None:
    x = torch.randn(37, 300, generator=torch.Generator().manual_seed(3))
    shape = {"rows": 37, "cols": 300}
    spec = get_kernel("softmax")
    rule = spec.default_config(shape, "float32", LIMITS)
    tiled = spec.run((x,), rule, shape, spec.backends()[-1])
    assert isinstance(tiled, torch.Tensor)
    torch_result = torch.softmax(x, -1)
    assert not torch.equal(tiled, torch_result)  # the tiled kernel's bits differ: the test can tell
    with using_source(None):
        assert torch.equal(OPS.softmax(x), torch_result)  # no source: torch's op
    with using_source(FixedSource(rule, match="default")):
        assert torch.equal(OPS.softmax(x), torch_result)  # the client's rule is no measured answer


@pytest.mark.skipif(
    "native" not in get_kernel("rms_norm").backends(), reason="the native kernels are not built"
)
def test_an_untuned_rms_norm_runs_its_native_rule_which_measured_faster() -> None:
    x, w = _rms_inputs()
    shape = {"rows": 37, "cols": 300}
    spec = get_kernel("rms_norm")
    rule = spec.run((x, w), spec.default_config(shape, "float32", LIMITS), shape, "native")
    assert isinstance(rule, torch.Tensor)
    assert not torch.equal(rule, functional.rms_norm(x, (300,), w, 1e-6))
    with using_source(None):
        assert torch.equal(OPS.rms_norm(x, w), rule)


def test_a_measured_answer_runs_as_answered_torch_op_or_tiles() -> None:
    x, w = _rms_inputs()
    shape = {"rows": 37, "cols": 300}
    spec = get_kernel("rms_norm")
    tiles = next(c for c in spec.space(shape, "float32", LIMITS) if c["tile_cols"] < 300)
    expected_tiled = spec.run((x, w), tiles, shape, "native" if "native" in spec.backends() else "torch")
    assert isinstance(expected_tiled, torch.Tensor)
    with using_source(FixedSource(tiles, match="nearest")):
        assert torch.equal(OPS.rms_norm(x, w), expected_tiled)
    with using_source(FixedSource({"vendor": 1})):
        assert torch.equal(OPS.rms_norm(x, w), functional.rms_norm(x, (300,), w, 1e-6))


def test_a_caller_running_its_own_tiles_gets_the_default_for_torch_op() -> None:
    x, w = _rms_inputs()
    spec = get_kernel("rms_norm")
    source = FixedSource({"vendor": 1})
    selection = select_config(spec, x, w, client=source)
    assert selection.config == spec.default_config({"rows": 37, "cols": 300}, "float32", LIMITS)
    assert (selection.source, selection.measured) == ("default", False)
    chosen = select_config(spec, x, w, client=source, runs_vendor=True)
    assert is_vendor(chosen.config)
    assert (chosen.source, chosen.measured) == ("client", True)


def test_untuned_attention_forward_and_backward_are_torch_ops() -> None:
    generator = torch.Generator().manual_seed(5)
    q = torch.randn(1, 4, 40, 16, generator=generator, requires_grad=True)
    k, v = (torch.randn(1, 2, 40, 16, generator=generator, requires_grad=True) for _ in range(2))
    grad = torch.randn(1, 4, 40, 16, generator=generator)
    with using_source(None):
        out, _ = OPS.fused_attention(q, k, v, causal=1)
        out.backward(grad)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    expected = functional.scaled_dot_product_attention(
        leaves[0], leaves[1], leaves[2], is_causal=True, enable_gqa=True
    )
    torch.autograd.backward(expected, grad)
    assert torch.equal(out, expected)
    for ours, theirs in zip((q, k, v), leaves, strict=True):
        assert ours.grad is not None
        assert theirs.grad is not None
        assert torch.equal(ours.grad, theirs.grad)


def test_attention_lse_used_in_the_loss_runs_the_tiled_backward() -> None:
    """torch's backward takes no gradient of the log-sum-exp: a loss on it gets the tiled kernel's,
    which matches the formula's."""
    generator = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 2, 24, 8, generator=generator, dtype=torch.float64) for _ in range(3))
    leaves = [t.float().requires_grad_() for t in (q, k, v)]
    with using_source(None):
        out, lse = OPS.fused_attention(*leaves, causal=1)
        (out.sum() + lse.sum()).backward()
    exact = [t.clone().requires_grad_() for t in (q, k, v)]
    out64, lse64 = OPS.fused_attention(*exact, causal=1)  # float64: the formula
    (out64.sum() + lse64.sum()).backward()
    for ours, theirs in zip(leaves, exact, strict=True):
        assert ours.grad is not None
        assert theirs.grad is not None
        torch.testing.assert_close(ours.grad.double(), theirs.grad, atol=1e-5, rtol=1e-5)
