"""Which kernels are declared: the built-ins' declarations, the replay kernels' when opted in, the plugins'.

Torch-free: what a server plans with (spaces, shapes, defaults, bytes). The torch half, what a
worker runs, is :mod:`tiletune.kernels.registry`, which holds a spec for each of these names.

Built-in kernels and plugins are families (:mod:`tiletune.kernels.family`): each implementation
of a family is a declared kernel. A plugin names its family under the entry-point group
``tiletune.families``::

    [project.entry-points."tiletune.families"]
    my_op = "my_package.family:FAMILY"

The older way still loads: a plugin declares its kernel's space under the group
``tiletune.spaces`` (an instance of :class:`~tiletune.kernels.declaration.KernelDeclaration`, or a
subclass taking no arguments), and its spec under ``tiletune.kernels``, with the same entry name (a
server loads the first, a worker the second)::

    [project.entry-points."tiletune.spaces"]
    my_op = "my_package.space:MY_OP"
    [project.entry-points."tiletune.kernels"]
    my_op = "my_package.tiling:MY_OP_SPEC"

A plugin that declares only a spec (``tiletune.kernels``) is declared by it where it loads (its
spec is a declaration); on a server without torch such a plugin is a warning and skipped. A
plugin that fails to load, or reuses a taken name, is a warning and skipped; it never breaks the
built-ins.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import warnings
from functools import cache

from tiletune.kernels.declaration import KernelDeclaration
from tiletune.kernels.errors import UnknownKernelError
from tiletune.kernels.family import builtin_families, plugin_families
from tiletune.kernels.replay.declaration import registered_replay_declarations

#: The entry-point group of plugins' declarations (torch-free).
SPACES_ENTRY_POINT_GROUP = "tiletune.spaces"
#: The entry-point group of plugins' specs (the torch half; :mod:`tiletune.kernels.registry`).
KERNELS_ENTRY_POINT_GROUP = "tiletune.kernels"


def as_declaration(obj: object, origin: str) -> KernelDeclaration:
    """``obj`` (an instance, or a subclass taking no arguments) as a declaration; ``TypeError`` naming
    ``origin`` otherwise."""
    if isinstance(obj, type) and issubclass(obj, KernelDeclaration):
        obj = obj()
    if not isinstance(obj, KernelDeclaration):
        raise TypeError(f"{origin} is {type(obj).__name__}, not a KernelDeclaration")
    return obj


def builtin_declarations() -> dict[str, KernelDeclaration]:
    """The declarations of the kernels shipped with tiletune, by name: every implementation of every
    built-in family (:func:`~tiletune.kernels.family.builtin_families`), family by family."""
    return {i.kernel: i.declaration for family in builtin_families().values() for i in family.implementations}


def family_declarations(taken: frozenset[str]) -> dict[str, KernelDeclaration]:
    """The declarations of the plugin families (``tiletune.families``), by name; a family declaring
    a name in ``taken`` (a replay kernel's) is a warning and skipped."""
    declared: dict[str, KernelDeclaration] = {}
    for family in plugin_families().values():
        clash = sorted(taken.intersection(family.kernels))
        if clash:
            warnings.warn(f"skipping kernel plugin {family.name!r}: name {clash[0]!r} is taken", stacklevel=2)
            continue
        declared.update({i.kernel: i.declaration for i in family.implementations})
    return declared


def plugin_declarations(group: str, skip: frozenset[str] = frozenset()) -> dict[str, KernelDeclaration]:
    """The declarations the entry points of ``group`` name (but those of the entry names in ``skip``),
    by entry name; one that fails to load is a warning and skipped."""
    loaded: dict[str, KernelDeclaration] = {}
    for entry in importlib.metadata.entry_points(group=group):
        if entry.name in skip:
            continue
        try:
            loaded[entry.name] = as_declaration(entry.load(), f"entry point {entry.name} ({entry.value})")
        except Exception as error:  # a broken plugin must not break the built-ins
            warnings.warn(f"skipping kernel plugin {entry.name!r}: {error}", stacklevel=2)
    return loaded


@cache
def all_declarations() -> dict[str, KernelDeclaration]:
    """Built-ins, the replay kernels when ``$TILETUNE_REPLAY_KERNELS`` is set, the plugin families
    (``tiletune.families``), then the older groups' plugins: their declarations
    (``tiletune.spaces``), then the specs of those that declare no space (``tiletune.kernels``,
    where they load). Read once per process."""
    declared: dict[str, KernelDeclaration] = {**builtin_declarations(), **registered_replay_declarations()}
    declared.update(family_declarations(frozenset(declared)))
    spaces = plugin_declarations(SPACES_ENTRY_POINT_GROUP)
    specs = plugin_declarations(KERNELS_ENTRY_POINT_GROUP, skip=frozenset(spaces))
    for entry_name, declaration in {**spaces, **specs}.items():
        if declaration.name in declared:
            warnings.warn(
                f"skipping kernel plugin {entry_name!r}: name {declaration.name!r} is taken", stacklevel=2
            )
            continue
        declared[declaration.name] = declaration
    return declared


def get_declaration(name: str) -> KernelDeclaration:
    """The declaration of the kernel called ``name``; raises :class:`UnknownKernelError` listing the
    known ones."""
    declared = all_declarations()
    try:
        return declared[name]
    except KeyError:
        raise UnknownKernelError(name, list(declared)) from None
