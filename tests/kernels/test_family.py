"""Kernel families: one folder each, found by one rule, one record of every implementation."""

from __future__ import annotations

from pathlib import Path

import pytest

from tiletune.kernels.declaration import PORTABLE_BACKEND
from tiletune.kernels.declarations import all_declarations
from tiletune.kernels.family import Family, Implementation, builtin_families, family_of
from tiletune.kernels.registry import all_kernels, load_spec
from tiletune.kernels.rms_norm.declaration import NativeRmsNormDeclaration, RmsNormDeclaration

KERNELS_FOLDER = Path(__file__).resolve().parents[2] / "kernels"


def test_every_folder_with_a_declaration_is_a_family_and_nothing_else_is() -> None:
    declared = {p.parent.name for p in KERNELS_FOLDER.glob("*/declaration.py")} - {"replay"}
    assert set(builtin_families()) == declared
    assert {p.parent.name for p in KERNELS_FOLDER.glob("*/family.py")} == declared


def test_each_implementation_is_a_declared_and_registered_kernel_of_its_family() -> None:
    for family in builtin_families().values():
        assert family.declaration is family.implementations[0].declaration
        for implementation in family.implementations:
            assert all_declarations()[implementation.kernel] is implementation.declaration
            spec = all_kernels()[implementation.kernel]
            assert spec.name == implementation.kernel
            assert family_of(implementation.kernel) is family
            # the spec declares what the family's record declares (the server plans with the latter)
            assert spec.knobs == implementation.declaration.knobs
            assert spec.dims == implementation.declaration.dims


def test_a_family_names_its_implementations_by_backend() -> None:
    rms_norm = builtin_families()["rms_norm"]
    assert [i.backend for i in rms_norm.implementations] == ["torch", "native", "triton"]
    native = rms_norm.implementation("native")
    assert native is not None
    assert native.kernel == "native_rms_norm"
    assert rms_norm.implementation("npu") is None
    assert family_of("no_such_kernel") is None


def test_a_family_refuses_a_record_that_contradicts_itself() -> None:
    own = Implementation(PORTABLE_BACKEND, RmsNormDeclaration(), "tiletune.kernels.rms_norm.portable:SPEC")
    native = Implementation("native", NativeRmsNormDeclaration(), "tiletune.kernels.rms_norm.native:SPEC")
    with pytest.raises(ValueError, match="first implementation must declare 'norm'"):
        Family("norm", (own,))
    with pytest.raises(ValueError, match="share a backend"):
        Family("rms_norm", (own, Implementation(PORTABLE_BACKEND, native.declaration, native.spec)))
    with pytest.raises(ValueError, match="is not 'module:attribute'"):
        Implementation(PORTABLE_BACKEND, RmsNormDeclaration(), "tiletune.kernels.rms_norm.portable")
    with pytest.raises(ValueError, match="first implementation"):
        Family("rms_norm", ())


def test_an_implementation_naming_another_kernels_spec_is_refused() -> None:
    wrong = Implementation("native", NativeRmsNormDeclaration(), "tiletune.kernels.rms_norm.portable:SPEC")
    with pytest.raises(TypeError, match="is the spec of 'rms_norm', not of 'native_rms_norm'"):
        load_spec(wrong)
