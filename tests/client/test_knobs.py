"""The client's check of a config against its kernel's knobs accepts exactly the spec's values.

For every registered kernel, the values the client derives from the bundle's
:class:`~tiletune.client.wire.KernelInfo` (``kernel_info``, what the server sends) are the
spec's ``knob_values(shape)`` for any shape; every config of the kernel's space passes the
check, and a value outside it, a missing or unknown knob, or a non-positive value fails.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiletune.client.knobs import adapt, allowed_values, config_problem, structure_problem
from tiletune.client.wire import KernelInfo
from tiletune.kernels import KernelSpec, all_kernels
from tiletune.kernels.declaration import Shape
from tiletune.kernels.info import kernel_info

KERNELS = sorted(all_kernels())


@st.composite
def shapes(draw: st.DrawFn, spec: KernelSpec) -> Shape:
    return {
        dim.name: draw(st.sampled_from(dim.choices)) if dim.choices else draw(st.integers(1, 1 << 24))
        for dim in spec.dims
    }


@pytest.mark.parametrize("name", KERNELS)
def test_every_kernel_is_sent_with_its_values(name: str) -> None:
    info = kernel_info(all_kernels()[name])
    assert info.knob_values is not None
    assert info.clamp_rule in ("min", "pow2_ceil")


@pytest.mark.parametrize("name", KERNELS)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_the_checked_values_are_exactly_the_specs(name: str, data: st.DataObject) -> None:
    spec = all_kernels()[name]
    info = kernel_info(spec)
    shape = data.draw(shapes(spec))
    allowed = allowed_values(info, shape)
    assert allowed is not None
    assert {k: set(v) for k, v in allowed.items()} == {k: set(v) for k, v in spec.knob_values(shape).items()}
    values = spec.knob_values(shape)
    config = {knob: data.draw(st.sampled_from(choices)) for knob, choices in values.items()}
    assert config_problem(config, shape, info) is None
    knob = data.draw(st.sampled_from(sorted(config)))
    outside = data.draw(st.integers(1, 1 << 30).filter(lambda v: v not in values[knob]))
    assert config_problem({**config, knob: outside}, shape, info) is not None
    assert config_problem({**config, knob: 0}, shape, info) is not None
    assert config_problem({**config, knob: -1}, shape, info) is not None
    assert config_problem({**config, knob: True}, shape, info) is not None
    assert config_problem({k: v for k, v in config.items() if k != knob}, shape, info) is not None
    assert config_problem({**config, "unknown_knob": 1}, shape, info) is not None


@pytest.mark.parametrize("name", KERNELS)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_an_adapted_config_is_one_of_the_shapes(name: str, data: st.DataObject) -> None:
    spec = all_kernels()[name]
    info = kernel_info(spec)
    tuned, asked = data.draw(shapes(spec)), data.draw(shapes(spec))
    config = {knob: data.draw(st.sampled_from(v)) for knob, v in spec.knob_values(tuned).items()}
    adapted = adapt(config, asked, info)
    assert adapted is not None
    assert spec.parse_config(adapted, asked) == adapted  # what the launcher accepts


@settings(max_examples=300, deadline=None)
@given(
    st.recursive(
        st.none() | st.integers() | st.text() | st.floats(),
        lambda i: st.lists(i) | st.dictionaries(st.text(), i),
    )
)
def test_the_checks_never_raise(config: object) -> None:
    info = KernelInfo(
        name="k", version=1, dims=["n"], knobs=["t"], knob_values={"t": [4, 8]}, clamp_to={"t": "n"}
    )
    structure_problem(config)
    config_problem(config, {"n": 6}, info)
    config_problem(config, {}, info)


def test_an_info_without_values_or_with_an_unknown_rule_checks_names_and_structure() -> None:
    old = KernelInfo(name="add", version=1, dims=["n"], knobs=["tile_size"])
    newer = old.model_copy(update={"knob_values": {"tile_size": [256]}, "clamp_rule": "log2_floor"})
    for info in (old, newer):
        assert allowed_values(info, {"n": 64}) is None
        assert config_problem({"tile_size": 3}, {"n": 64}, info) is None
        assert config_problem({"tile_sise": 3}, {"n": 64}, info) is not None
        assert config_problem({"tile_size": 0}, {"n": 64}, info) is not None
    assert config_problem({"anything": 3}, {"n": 64}, None) is None
    assert config_problem({"anything": -3}, {"n": 64}, None) is not None
