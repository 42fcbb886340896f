"""The launch helper: shape from the tensors, config from a source, the default when it is invalid."""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import pytest
import torch

from tests.kernels.cases import one_tensor
from tiletune.kernels import launch, select_config, tiled
from tiletune.kernels.declaration import Config, Shape, element_size
from tiletune.kernels.device import cpu_chip
from tiletune.kernels.errors import DTypeError, InputError, ShapeError
from tiletune.kernels.launcher import ConfigSource
from tiletune.kernels.registry import builtin_kernels
from tiletune.kernels.spec import DeviceLimits, Dim, KernelSpec, Knob

CPU = torch.device("cpu")
KERNELS = builtin_kernels()
LIMITS = cpu_chip().limits
GELU_PLUGIN = Path(__file__).resolve().parents[2] / "examples" / "gelu_plugin" / "tiletune_example_gelu"

#: One small shape per kernel that no tile divides.
SHAPES: dict[str, Shape] = {
    "add": {"n": 3000},
    "softmax": {"rows": 9, "cols": 100},
    "rms_norm": {"rows": 7, "cols": 96},
    "matmul": {"m": 40, "n": 24, "k": 56, "a_transposed": 0, "b_transposed": 0},
    "fused_attention": {
        "batch": 1,
        "heads": 2,
        "kv_heads": 2,
        "seq_q": 40,
        "seq_kv": 56,
        "head_dim": 16,
        "causal": 0,
        "mask": 0,
    },
}


@dataclass(frozen=True)
class Answer:
    """What a config source returns: the config (a ``ConfigClient`` returns more)."""

    config: Mapping[str, int]


@dataclass
class FixedSource:
    """A config source that answers every lookup with one config and records what it was asked."""

    config: Mapping[str, int]
    asked: list[tuple[str, dict[str, int], str]] = field(default_factory=list)

    def get(self, kernel: str, shape: Mapping[str, int], dtype: str) -> Answer:
        self.asked.append((kernel, dict(shape), dtype))
        return Answer(self.config)


class BrokenSource:
    """A config source whose lookups fail (a client must not, but launch survives it)."""

    def get(self, kernel: str, shape: Mapping[str, int], *, dtype: str) -> Answer:
        raise ConnectionError("tuner unreachable")


def a_valid_config(spec: KernelSpec, shape: Shape, dtype: str) -> Config:
    """A valid config other than the default: the smallest tiles, double-buffered, depth 2."""
    default = spec.default_config(shape, dtype, LIMITS)
    space = spec.space(shape, dtype, LIMITS)
    return next(c for c in space if c != default and c["buffer_num"] == 2 and c["pipeline_depth"] == 2)


def assert_close_to_reference(
    spec: KernelSpec, inputs: Sequence[torch.Tensor], shape: Shape, out: torch.Tensor
) -> None:
    expected = one_tensor(spec.reference(inputs, shape))
    tolerance = spec.tolerance("float32")
    assert out.dtype == inputs[0].dtype
    torch.testing.assert_close(out.float(), expected.float(), atol=tolerance.atol, rtol=tolerance.rtol)


@pytest.mark.parametrize("name", list(SHAPES))
def test_shape_of_reads_the_shape_make_inputs_built(name: str) -> None:
    spec = KERNELS[name]
    assert spec.shape_of(spec.make_inputs(SHAPES[name], "float32", CPU)) == SHAPES[name]


@pytest.mark.parametrize("name", list(SHAPES))
def test_a_valid_config_from_the_source_is_the_one_run(name: str) -> None:
    spec, shape = KERNELS[name], SHAPES[name]
    config = a_valid_config(spec, shape, "float32")
    source = FixedSource(config)
    inputs = spec.make_inputs(shape, "float32", CPU, seed=1)

    selection = select_config(name, *inputs, client=source)
    out = launch(name, *inputs, client=source)

    assert selection.source == "client"
    assert selection.config == config
    assert selection.reason is None
    assert source.asked[-1] == (name, shape, "float32")
    assert list(source.asked[-1][1]) == [d.name for d in spec.dims]  # canonical order
    assert_close_to_reference(spec, inputs, shape, out)


@pytest.mark.parametrize("name", list(SHAPES))
def test_an_invalid_config_falls_back_to_the_default_and_stays_correct(name: str) -> None:
    spec, shape = KERNELS[name], SHAPES[name]
    valid = a_valid_config(spec, shape, "float32")
    inputs = spec.make_inputs(shape, "float32", CPU, seed=2)
    default = spec.default_config(shape, "float32", LIMITS)
    refused = {
        "violates a constraint": {**valid, "buffer_num": 1, "pipeline_depth": 3},
        "outside the space": {**valid, "buffer_num": 99},
        "unknown knob": {**valid, "nonsense": 1},
        "missing knobs": {},
    }
    for why, config in refused.items():
        selection = select_config(spec, *inputs, client=FixedSource(config))
        assert selection.source == "default", why
        assert selection.config == default, why
        assert selection.reason, why
        assert_close_to_reference(spec, inputs, shape, launch(spec, *inputs, client=FixedSource(config)))


def test_a_failing_source_or_a_nonsense_answer_never_fails_the_launch() -> None:
    spec, shape = KERNELS["add"], SHAPES["add"]
    inputs = spec.make_inputs(shape, "float32", CPU)
    selection = select_config("add", *inputs, client=BrokenSource())
    assert selection.source == "default"
    assert "tuner unreachable" in (selection.reason or "")
    assert_close_to_reference(spec, inputs, shape, launch("add", *inputs, client=BrokenSource()))
    nonsense = FixedSource({"tile_size": [256], "buffer_num": 2, "pipeline_depth": 2})  # type: ignore[dict-item]
    assert select_config("add", *inputs, client=nonsense).source == "default"


def test_a_refused_config_is_logged_once_per_call_key(caplog: pytest.LogCaptureFixture) -> None:
    a, b = KERNELS["add"].make_inputs({"n": 4321}, "float32", CPU)
    source = FixedSource({"tile_size": 256, "buffer_num": 1, "pipeline_depth": 3})
    with caplog.at_level(logging.WARNING, logger="tiletune.kernels.launcher"):
        for _ in range(3):
            launch("add", a, b, client=source)
    refusals = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1
    assert "pipeline_depth=3 needs buffer_num >= 2" in refusals[0].getMessage()


@pytest.mark.parametrize("causal", [1, 2])
def test_causal_is_given_by_keyword_and_asked_for(causal: int) -> None:
    spec = KERNELS["fused_attention"]
    shape = {**SHAPES["fused_attention"], "causal": causal}
    inputs = spec.make_inputs(shape, "float32", CPU, seed=4)
    source = FixedSource(a_valid_config(spec, shape, "float32"))
    out = launch("fused_attention", *inputs, client=source, causal=causal)
    assert source.asked[-1][1]["causal"] == causal
    assert_close_to_reference(spec, inputs, shape, out)


def test_a_mask_is_a_fourth_tensor_and_grouped_heads_are_read_from_k() -> None:
    spec = KERNELS["fused_attention"]
    shape = {**SHAPES["fused_attention"], "heads": 4, "kv_heads": 2, "causal": 2, "mask": 1}
    inputs = spec.make_inputs(shape, "float32", CPU, seed=5)
    assert len(inputs) == 4
    assert spec.shape_of(inputs) == {**shape, "causal": 0}  # the tensors cannot tell causal
    source = FixedSource(a_valid_config(spec, shape, "float32"))
    out = launch("fused_attention", *inputs, client=source, causal=2)
    assert source.asked[-1][1] == shape
    assert out.shape == inputs[0].shape  # the output only, not the log-sum-exp
    assert_close_to_reference(spec, inputs, shape, out)


def test_keyword_dims_may_not_contradict_the_tensors_or_name_unknown_dims() -> None:
    a, b = KERNELS["add"].make_inputs({"n": 100}, "float32", CPU)
    source = FixedSource({})
    with pytest.raises(ShapeError) as error:
        launch("add", a, b, client=source, n=50)
    assert error.value.field == "shape.n"
    assert "the tensors say 100" in str(error.value)
    launch("add", a, b, client=source, n=100)  # agreeing is fine
    with pytest.raises(ShapeError, match="has no dim"):
        launch("add", a, b, client=source, causal=1)
    q, k, v = KERNELS["fused_attention"].make_inputs(SHAPES["fused_attention"], "float32", CPU)
    with pytest.raises(ShapeError, match="must be one of"):
        launch("fused_attention", q, k, v, client=source, causal=3)
    launch("fused_attention", q, k, v, client=source, mask=0)  # the tensors say no mask: agreeing
    with pytest.raises(ShapeError) as error:
        launch("fused_attention", q, k, v, client=source, mask=1)
    assert error.value.field == "shape.mask"
    a, b = KERNELS["matmul"].make_inputs(SHAPES["matmul"], "float32", CPU)
    launch("matmul", a, b.t().contiguous().t(), client=source, b_transposed=1)
    with pytest.raises(ShapeError) as error:
        launch("matmul", a, b, client=source, a_transposed=1)
    assert error.value.field == "shape.a_transposed"


def test_row_kernels_and_add_take_any_leading_dims() -> None:
    source = FixedSource({})
    x = torch.randn(3, 4, 50)
    for name, inputs in (
        ("add", (x, torch.randn(3, 4, 50))),
        ("softmax", (x,)),
        ("rms_norm", (x, torch.rand(50) + 0.5)),
    ):
        spec = KERNELS[name]
        shape = spec.shape_of(inputs)
        assert shape == ({"n": 600} if name == "add" else {"rows": 12, "cols": 50})
        out = launch(name, *inputs, client=source)
        assert out.shape == x.shape
        assert_close_to_reference(spec, inputs, shape, out)


@pytest.mark.parametrize(
    ("name", "inputs", "field", "message"),
    [
        ("add", (torch.ones(4), torch.ones(5)), "inputs.b", "must have a's size"),
        ("add", (torch.ones(4),), "inputs", "add takes 2 tensor(s) (a, b), got 1"),
        ("matmul", (torch.ones(4, 3), torch.ones(5, 2)), "inputs.b", "its first dim (k) is 5, expected 3"),
        ("matmul", (torch.ones(4), torch.ones(4, 2)), "inputs.a", "must be a matrix [m, k]"),
        ("rms_norm", (torch.ones(4, 3), torch.ones(4)), "inputs.w", "its length is 4, expected 3"),
        ("softmax", (torch.tensor(1.0),), "inputs.x", "at least one dim"),
        (
            "fused_attention",
            (torch.ones(1, 2, 8, 4), torch.ones(1, 2, 6, 4), torch.ones(1, 2, 7, 4)),
            "inputs.v",
            "seq_kv",
        ),
        (
            "fused_attention",
            (torch.ones(1, 4, 8, 4), torch.ones(1, 2, 6, 4), torch.ones(1, 1, 6, 4)),
            "inputs.v",
            "its kv_heads (dim 1, as k's) is 1, expected 2",
        ),
        (
            "fused_attention",
            (torch.ones(1, 2, 8, 4), torch.ones(2, 2, 6, 4), torch.ones(2, 2, 6, 4)),
            "inputs.k",
            "its batch (dim 0) is 2, expected 1",
        ),
        (
            "fused_attention",
            (*(torch.ones(1, 2, n, 4) for n in (8, 6, 6)), torch.zeros(1, 3, 8, 6)),
            "inputs.mask",
            "its heads (dim 1) or 1 is 3, expected 2",
        ),
    ],
)
def test_tensors_that_do_not_fit_the_kernel_name_the_input(
    name: str, inputs: tuple[torch.Tensor, ...], field: str, message: str
) -> None:
    with pytest.raises(ShapeError) as error:
        KERNELS[name].shape_of(inputs)
    assert error.value.field == field
    assert message in str(error.value)


def test_kv_heads_that_do_not_divide_the_query_heads_are_refused_at_launch() -> None:
    q, k, v = torch.ones(1, 2, 8, 4), torch.ones(1, 3, 6, 4), torch.ones(1, 3, 6, 4)
    assert KERNELS["fused_attention"].shape_of((q, k, v))["kv_heads"] == 3
    with pytest.raises(ShapeError) as error:
        launch("fused_attention", q, k, v, client=FixedSource({}))
    assert error.value.field == "shape.kv_heads"
    assert "must divide heads (2), got 3" in str(error.value)


def test_dtype_comes_from_the_tensors() -> None:
    source = FixedSource({})
    a, b = KERNELS["add"].make_inputs({"n": 64}, "bfloat16", CPU)
    assert select_config("add", a, b, client=source).dtype == "bfloat16"
    assert source.asked[-1][2] == "bfloat16"
    with pytest.raises(InputError, match="mix bfloat16, float32") as error:
        launch("add", a, b.float(), client=source)
    assert error.value.field == "dtype"
    assert select_config("add", a, b.float(), client=source, dtype="float32").dtype == "float32"
    with pytest.raises(DTypeError, match="float64"):
        launch("add", a.double(), b.double(), client=source)
    with pytest.raises(DTypeError, match="float8"):
        launch("add", a, b, client=source, dtype="float8")


def test_tiled_hands_the_chosen_config_to_an_implementation() -> None:
    spec = KERNELS["fused_attention"]
    shape = {**SHAPES["fused_attention"], "causal": 1}
    config = a_valid_config(spec, shape, "float32")
    source = FixedSource(config)
    seen: list[Config] = []

    @tiled("fused_attention", client=source)
    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, config: Config) -> torch.Tensor:
        seen.append(config)
        return one_tensor(spec.run((q, k, v), config, shape))

    inputs = spec.make_inputs(shape, "float32", CPU)
    out = attention(*inputs, causal=1)
    assert seen == [config]
    assert source.asked[-1][1] == shape
    assert attention.__name__ == "attention"
    assert_close_to_reference(spec, inputs, shape, out)


class ScaleSpec(KernelSpec):
    """A plugin's kernel that is tunable but never said how to read its shape from tensors."""

    name = "scale_plugin"
    version = 1
    description = "y = 2 x (test plugin without shape_of)"
    dims = (Dim("n", "elements"),)
    knobs = (Knob("tile_size", (64, 128), "elements per tile", clamp_to="n"),)

    def working_set_bytes(self, config: Config, shape: Shape, dtype: str) -> int:
        return 2 * config["tile_size"] * element_size(dtype)

    def default_config(self, shape: Shape, dtype: str, limits: DeviceLimits) -> Config:
        return {"tile_size": min(64, shape["n"])}

    def make_inputs(
        self, shape: Shape, dtype: str, device: torch.device, seed: int = 0
    ) -> tuple[torch.Tensor, ...]:
        return (torch.ones(shape["n"], device=device),)

    def reference(self, inputs: Sequence[torch.Tensor], shape: Shape) -> torch.Tensor:
        return 2 * inputs[0]

    def run(
        self, inputs: Sequence[torch.Tensor], config: Config, shape: Shape, backend: str = "torch"
    ) -> torch.Tensor:
        return 2 * inputs[0]

    def flops(self, shape: Shape) -> float:
        return float(shape["n"])

    def bytes_moved(self, shape: Shape, dtype: str) -> float:
        return 2.0 * shape["n"] * element_size(dtype)


def test_a_plugin_without_shape_of_gets_a_clear_error() -> None:
    with pytest.raises(NotImplementedError) as error:
        launch(ScaleSpec(), torch.ones(100), client=FixedSource({}))
    message = str(error.value)
    assert "'scale_plugin' (ScaleSpec) does not implement shape_of(inputs)" in message
    assert "override KernelSpec.shape_of" in message


def load_gelu_plugin() -> ModuleType:
    """The example plugin's spec module, imported from its source folder (it is not installed here)."""
    if str(GELU_PLUGIN.parent) not in sys.path:
        sys.path.append(str(GELU_PLUGIN.parent))
    return importlib.import_module("tiletune_example_gelu.spec")


def test_the_example_plugin_launches_with_its_shape_of() -> None:
    gelu: KernelSpec = load_gelu_plugin().SPEC
    x = torch.randn(4, 300)
    assert gelu.shape_of((x,)) == {"n": 1200}
    source = FixedSource({"tile_size": 256})
    selection = select_config(gelu, x, client=source)
    assert selection.source == "client"
    out = launch(gelu, x, client=source)
    assert out.shape == x.shape
    assert_close_to_reference(gelu, (x,), {"n": 1200}, out)


def test_a_config_client_shaped_source_satisfies_the_protocol() -> None:
    """Static check (mypy): the test sources are ConfigSources, keyword-only or not."""
    sources: list[ConfigSource] = [FixedSource({}), BrokenSource()]
    assert len(sources) == 2


def test_a_native_config_over_every_core_of_this_cpu_is_taken_as_given() -> None:
    """``block_dim`` runs up to the cores this CPU's limits report: a client's config that spreads
    the tiles over all of them is the client's, not refused for the default."""
    cores = cpu_chip().limits.cores
    assert cores is not None
    config = {"tile_size": 256, "block_dim": cores, "buffer_num": 2, "pipeline_depth": 2}
    x = torch.randn(1 << 16)
    selection = select_config("native_add", x, x, client=FixedSource(config))

    assert selection.source == "client", selection.reason
    assert selection.config == config


def test_launch_keeps_the_gradient_through_the_kernels_operator() -> None:
    q, k, v = (torch.randn(1, 2, 9, 16, requires_grad=True) for _ in range(3))
    out = launch("fused_attention", q, k, v, client=FixedSource({}), causal=2)
    torch.autograd.backward(out.sum())

    assert out.grad_fn is not None
    assert all(t.grad is not None and t.grad.abs().sum() > 0 for t in (q, k, v))


def test_a_kernel_without_an_operator_refuses_tensors_that_need_a_gradient() -> None:
    x = torch.ones(100, requires_grad=True)
    with pytest.raises(InputError, match="no operator with a backward"):
        launch(ScaleSpec(), x, client=FixedSource({"tile_size": 64}))
