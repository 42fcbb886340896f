"""A kernel family: one folder of ``kernels/``, one record of the kernel and its implementations.

A family is what an operator means by a kernel (``rms_norm``): the problem it solves and the
implementations that compute it, each an :class:`Implementation` the record holds:

- ``backend``: the implementation's name (``torch``: the tiled PyTorch pipeline; ``native``: the
  C++ kernels on CPUs; ``triton``; a plugin's own);
- ``declaration``: its tuning space (dims, knobs, constraints, default rule, counts), torch-free:
  what a server plans with. Its ``name`` is the tuned kernel's name (the first implementation's is
  the family's own);
- ``spec``: where its torch half lives, ``module:attribute``, imported by a worker or an operator
  on first use (:func:`tiletune.kernels.registry.load_spec`).

torch's own op is not an entry: it is a config of the family (the vendor config,
:mod:`tiletune.kernels.vendor`), declared by ``has_vendor`` and run by the spec's ``vendor``.

Discovery, one rule for built-ins and plugins, no list to edit:

- built-in: every folder of ``kernels/`` holding a ``family.py`` whose ``FAMILY`` is the record;
- plugin: an entry point of the group ``tiletune.families`` naming a :class:`Family` (a plugin
  written against the older groups, ``tiletune.spaces`` and ``tiletune.kernels``, still loads:
  :mod:`tiletune.kernels.declarations`).

Importing this module imports no torch.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import warnings
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from tiletune.kernels.declaration import PORTABLE_BACKEND, KernelDeclaration
from tiletune.kernels.native.space import NATIVE_BACKEND
from tiletune.kernels.triton.space import TRITON_BACKEND

#: The entry-point group of plugin families (a :class:`Family` each).
FAMILIES_ENTRY_POINT_GROUP = "tiletune.families"
#: The module of a built-in family's folder that holds its record, ``FAMILY``.
FAMILY_MODULE = "family"
_KERNELS_PACKAGE = "tiletune.kernels"


@dataclass(frozen=True)
class Implementation:
    """One implementation of a family: its backend, its declared space, where its spec lives."""

    backend: str
    declaration: KernelDeclaration
    spec: str

    def __post_init__(self) -> None:
        if ":" not in self.spec:
            raise ValueError(f"implementation {self.backend!r}: spec {self.spec!r} is not 'module:attribute'")

    @property
    def kernel(self) -> str:
        """The tuned kernel's name: its declaration's."""
        return self.declaration.name


@dataclass(frozen=True)
class Family:
    """A kernel and its implementations; the first implementation's kernel is the family's name."""

    name: str
    implementations: tuple[Implementation, ...]

    def __post_init__(self) -> None:
        if not self.implementations or self.implementations[0].kernel != self.name:
            raise ValueError(f"family {self.name!r}: its first implementation must declare {self.name!r}")
        for field, values in (
            ("backend", [i.backend for i in self.implementations]),
            ("kernel", [i.kernel for i in self.implementations]),
        ):
            if len(set(values)) != len(values):
                raise ValueError(f"family {self.name!r}: two implementations share a {field}: {values}")

    @property
    def declaration(self) -> KernelDeclaration:
        """The family's own declaration (its first implementation's): the problem and the rule."""
        return self.implementations[0].declaration

    def implementation(self, backend: str) -> Implementation | None:
        """The implementation called ``backend``, or None when the family has none."""
        return next((i for i in self.implementations if i.backend == backend), None)

    @property
    def kernels(self) -> tuple[str, ...]:
        """The tuned kernels' names, one per implementation, the family's own first."""
        return tuple(i.kernel for i in self.implementations)


def tiled_family(
    package: str, portable: KernelDeclaration, native: KernelDeclaration, triton: KernelDeclaration
) -> Family:
    """A family of the three tiled implementations, named as ``portable`` declares: the tiled PyTorch
    pipeline, the native C++ and the Triton kernel, each the ``SPEC`` of its module of ``package``
    (``portable``, ``native``, ``triton``), as every built-in family but ``compiled_matmul`` has them."""
    return Family(
        portable.name,
        (
            Implementation(PORTABLE_BACKEND, portable, f"{package}.portable:SPEC"),
            Implementation(NATIVE_BACKEND, native, f"{package}.native:SPEC"),
            Implementation(TRITON_BACKEND, triton, f"{package}.triton:SPEC"),
        ),
    )


def _as_family(obj: object, origin: str) -> Family:
    if not isinstance(obj, Family):
        raise TypeError(f"{origin} is {type(obj).__name__}, not a Family")
    return obj


def _family_folders() -> list[str]:
    """The names of the folders of ``kernels/`` holding a ``family.py``, sorted (nothing imported)."""
    package = importlib.import_module(_KERNELS_PACKAGE)
    return sorted(
        {
            folder.name
            for root in package.__path__
            for folder in Path(root).iterdir()
            if (folder / f"{FAMILY_MODULE}.py").is_file()
        }
    )


@cache
def builtin_families() -> dict[str, Family]:
    """The families shipped with tiletune, by name: one per folder of ``kernels/`` with a ``family.py``."""
    families = {}
    for folder in _family_folders():
        module = f"{_KERNELS_PACKAGE}.{folder}.{FAMILY_MODULE}"
        family = _as_family(importlib.import_module(module).FAMILY, f"{module}.FAMILY")
        families[family.name] = family
    return families


def _load_plugin_families(taken: frozenset[str]) -> dict[str, Family]:
    """The families of the ``tiletune.families`` entry points, by name; one that fails to load or
    declares a kernel name in ``taken`` (or another plugin's) is a warning and skipped."""
    families: dict[str, Family] = {}
    names = set(taken)
    for entry in importlib.metadata.entry_points(group=FAMILIES_ENTRY_POINT_GROUP):
        try:
            family = _as_family(entry.load(), f"entry point {entry.name} ({entry.value})")
        except Exception as error:  # a broken plugin must not break the built-ins
            warnings.warn(f"skipping kernel plugin {entry.name!r}: {error}", stacklevel=2)
            continue
        clash = sorted(names.intersection(family.kernels))
        if clash:
            warnings.warn(f"skipping kernel plugin {entry.name!r}: name {clash[0]!r} is taken", stacklevel=2)
            continue
        names.update(family.kernels)
        families[family.name] = family
    return families


@cache
def all_families() -> dict[str, Family]:
    """The built-in families, then the plugins' (``tiletune.families``). Read once per process."""
    builtin = builtin_families()
    taken = frozenset(kernel for family in builtin.values() for kernel in family.kernels)
    return {**builtin, **_load_plugin_families(taken)}


def plugin_families() -> dict[str, Family]:
    """The plugins' families (:func:`all_families` but the built-ins), by name."""
    builtin = builtin_families()
    return {name: family for name, family in all_families().items() if name not in builtin}


@cache
def _families_by_kernel() -> dict[str, Family]:
    return {kernel: family for family in all_families().values() for kernel in family.kernels}


def family_of(kernel: str) -> Family | None:
    """The family one of whose implementations is the kernel called ``kernel``; None for a kernel
    outside every family (a replay kernel, a plugin of the older groups). A dict lookup: operators
    ask it on every call."""
    return _families_by_kernel().get(kernel)
