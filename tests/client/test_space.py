"""One declaration of a kernel's tuning space: the knobs' value rules as data, evaluated once.

The kernels, the server's description of a kernel (``kernel_info``) and the client evaluate
:mod:`tiletune.client.space`; the server reads the declared rules, never probes shapes.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tiletune.client.knobs import allowed_values
from tiletune.client.space import (
    CLAMP_RULES,
    DeviceLimits,
    Dim,
    Knob,
    adapt,
    candidates,
    clamped,
    knob_values,
    pow2_ceil,
    pow2_up_to,
)
from tiletune.kernels import all_kernels
from tiletune.kernels.add.portable import AddSpec
from tiletune.kernels.declaration import Shape
from tiletune.kernels.info import kernel_info
from tiletune.kernels.triton.spec import TritonSpec


def test_the_declaration_imports_without_torch() -> None:
    code = "import sys, tiletune.client.space; print('torch' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_pow2_ceil() -> None:
    assert [pow2_ceil(v) for v in (0, 1, 2, 3, 4, 5, 16, 17, 1000)] == [1, 1, 2, 4, 4, 8, 16, 32, 1024]


def test_the_rules_clamp_as_declared() -> None:
    tile = Knob("tile", (16, 64, 256), "", clamp_to="n")
    block = Knob("block", (16, 64, 256), "", clamp_to="n", clamp="pow2_ceil")
    plain = Knob("stages", (3, 1, 2), "")
    assert knob_values((tile, block, plain), {"n": 40}) == {
        "tile": (16, 40),
        "block": (16, 64),
        "stages": (3, 1, 2),
    }
    assert clamped((16, 64), 3, "pow2_ceil") == (16,)
    assert clamped((16, 64), 3, "min") == (3,)


def test_a_knob_declaring_an_unknown_rule_is_refused() -> None:
    with pytest.raises(ValueError, match="clamp 'log2' is not one of"):
        Knob("tile", (1, 2), "", clamp_to="n", clamp="log2")


def test_a_knob_up_to_the_cores_runs_up_to_the_chips_where_known() -> None:
    cores = Knob("block_dim", (1, 2), "", up_to="cores")
    assert pow2_up_to(1) == (1,)
    assert pow2_up_to(6) == (1, 2, 4, 6)
    assert candidates(cores, DeviceLimits(1 << 20, cores=64)) == (1, 2, 4, 8, 16, 32, 64)
    assert knob_values((cores,), {}, DeviceLimits(1 << 20, cores=6)) == {"block_dim": (1, 2, 4, 6)}
    assert knob_values((cores,), {}, DeviceLimits(1 << 20)) == {"block_dim": (1, 2)}  # not reported
    assert knob_values((cores,), {}) == {"block_dim": (1, 2)}
    with pytest.raises(ValueError, match="up_to 'threads' is not one of"):
        Knob("block_dim", (1,), "", up_to="threads")


@pytest.mark.parametrize("cores", [1, 2, 6, 64])
def test_a_native_kernel_is_planned_for_the_chips_cores(cores: int) -> None:
    spec = all_kernels()["native_add"]
    limits = DeviceLimits(1 << 20, cores=cores)
    shape = {"n": 1 << 22}
    assert spec.knob_values(shape, limits)["block_dim"] == pow2_up_to(cores)
    assert spec.default_config(shape, "float32", limits)["block_dim"] == cores
    assert {config["block_dim"] for config in spec.space(shape, "float32", limits)} == set(pow2_up_to(cores))
    assert spec.parse_config(spec.default_config(shape, "float32", limits), shape, limits)


def test_adapt_snaps_down_and_refuses_other_knobs() -> None:
    values = {"tile": (16, 40), "stages": (1, 2)}
    assert adapt({"tile": 64, "stages": 1}, values) == {"tile": 40, "stages": 1}
    assert adapt({"tile": 8, "stages": 2}, values) == {"tile": 16, "stages": 2}
    assert adapt({"tile": 8}, values) is None


@pytest.mark.parametrize("name", sorted(all_kernels()))
def test_every_kernel_declares_its_rule(name: str) -> None:
    spec = all_kernels()[name]
    info = kernel_info(spec)
    declared = {knob.clamp for knob in spec.knobs if knob.clamp_to is not None}
    assert info.clamp_rule in CLAMP_RULES
    assert declared <= {info.clamp_rule}
    if isinstance(spec, TritonSpec):
        assert declared == {"pow2_ceil"}


class _OwnRule(AddSpec):
    """A plugin whose ``knob_values`` is code of its own: the declared rule ``min`` on the
    shapes the server used to probe with, another one above them."""

    name = "own_rule"

    def knob_values(self, shape: Shape, limits: DeviceLimits | None = None) -> dict[str, tuple[int, ...]]:
        values = super().knob_values(shape, limits)
        return {**values, "tile_size": values["tile_size"][:1]} if shape["n"] > 6_000_000 else values


def test_a_kernel_with_a_rule_of_its_own_is_described_without_values() -> None:
    spec = _OwnRule()
    info = kernel_info(spec)
    assert info.knob_values is None
    assert allowed_values(info, {"n": 10_000_000}) is None
    assert len(spec.knob_values({"n": 10_000_000})["tile_size"]) == 1


def test_knobs_declaring_different_rules_are_described_without_values() -> None:
    class Mixed(AddSpec):
        name = "mixed_rules"
        dims = (Dim("m", "rows"), Dim("n", "columns"))  # type: ignore[assignment]
        knobs = (
            Knob("tile_m", (16, 64), "rows per tile", clamp_to="m"),
            Knob("block_n", (16, 64), "columns per block", clamp_to="n", clamp="pow2_ceil"),
        )

    info = kernel_info(Mixed())
    assert info.knob_values is None
    assert info.knobs == ["tile_m", "block_n"]
