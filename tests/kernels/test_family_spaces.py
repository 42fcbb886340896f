"""Every declared space, default and constraint is what it was: ``declared_spaces.json`` against the code.

The file is the description (:mod:`tests.kernels.spaces`) of every built-in kernel as declared
before the kernels became families; a move of code between files that changes a space, a default
config, a constraint's verdict or a count fails here, naming the kernel and the sample.
"""

from __future__ import annotations

import json

import pytest

from tests.kernels.spaces import GOLDEN, LIMITS, describe, sample
from tiletune.kernels.declarations import all_declarations

RECORDED = json.loads(GOLDEN.read_text())


def test_every_recorded_kernel_is_declared_with_samples() -> None:
    assert set(RECORDED) <= set(all_declarations())
    assert all(kernel["samples"] for kernel in RECORDED.values())


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_the_kernel_declares_what_it_did(name: str) -> None:
    declaration = all_declarations()[name]
    now = json.loads(json.dumps(describe(declaration)))
    recorded = RECORDED[name]
    assert {k: v for k, v in now.items() if k != "samples"} == {
        k: v for k, v in recorded.items() if k != "samples"
    }
    assert list(now["samples"]) == list(recorded["samples"])
    for key, was in recorded["samples"].items():
        if now["samples"][key] != was:
            canonical, dtype, chip = key.split(" ")
            shape = declaration.parse_shape(dict(pair.split("=") for pair in canonical.split(",")))
            pytest.fail(f"{name} at {key}: now {sample(declaration, shape, dtype, LIMITS[chip])}, was {was}")
