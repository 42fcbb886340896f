"""Which kernels run: a spec (the torch half) for each built-in, replay and plugin kernel.

Each implementation of a family (:mod:`tiletune.kernels.family`: the built-ins' folders, the
plugins' ``tiletune.families`` entry points) names its spec, loaded here (:func:`load_spec`). A
plugin of the older groups registers a :class:`~tiletune.kernels.spec.KernelSpec` (an instance, or
a subclass taking no arguments) under the entry-point group ``tiletune.kernels``, and its space,
torch-free, under ``tiletune.spaces`` with the same entry name
(:mod:`tiletune.kernels.declarations`, what a server reads)::

    [project.entry-points."tiletune.kernels"]
    my_op = "my_package.tiling:MY_OP_SPEC"

Every local command (``tune``, ``bench``, ``kernels``) and every worker looks kernels up here, so
plugins are treated exactly like built-ins. A plugin that fails to load, or reuses a built-in
name, is reported as a warning and skipped; it never breaks the built-ins.

Replay kernels (recorded spaces measured by lookup, :mod:`tiletune.kernels.replay.spec`)
are added only when ``$TILETUNE_REPLAY_KERNELS`` names their directory, before the plugins
(a plugin may not take their names). :func:`kernels_for` is what a device of one kind offers:
a replay device runs the replay kernels alone, and they run on nothing else.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import warnings
from functools import cache

from tiletune.kernels.declarations import KERNELS_ENTRY_POINT_GROUP
from tiletune.kernels.errors import UnknownKernelError
from tiletune.kernels.family import Family, Implementation, builtin_families, plugin_families
from tiletune.kernels.replay.declaration import REPLAY_KIND
from tiletune.kernels.replay.spec import is_replay_kernel, registered_replay_kernels
from tiletune.kernels.spec import KernelSpec


def _as_spec(obj: object, origin: str) -> KernelSpec:
    if isinstance(obj, type) and issubclass(obj, KernelSpec):
        obj = obj()
    if not isinstance(obj, KernelSpec):
        raise TypeError(f"{origin} is {type(obj).__name__}, not a KernelSpec")
    return obj


def load_spec(implementation: Implementation) -> KernelSpec:
    """The spec of one implementation of a family, imported from where it names it; ``TypeError``
    when it is no spec, or the spec of another kernel."""
    module, _, attribute = implementation.spec.partition(":")
    spec = _as_spec(getattr(importlib.import_module(module), attribute), implementation.spec)
    if spec.name != implementation.kernel:
        raise TypeError(
            f"{implementation.spec} is the spec of {spec.name!r}, not of {implementation.kernel!r}"
        )
    return spec


def family_kernels(family: Family) -> dict[str, KernelSpec]:
    """The specs of every implementation of ``family``, by kernel name, the family's own first."""
    return {i.kernel: load_spec(i) for i in family.implementations}


def builtin_kernels() -> dict[str, KernelSpec]:
    """The kernels shipped with tiletune, by name: every implementation of every built-in family."""
    return {name: spec for f in builtin_families().values() for name, spec in family_kernels(f).items()}


def _plugin_family_kernels(taken: frozenset[str]) -> dict[str, KernelSpec]:
    """The specs of the plugin families (``tiletune.families``) whose names are not ``taken``; a
    family whose specs fail to load is a warning and skipped."""
    kernels: dict[str, KernelSpec] = {}
    for family in plugin_families().values():
        if taken.intersection(family.kernels):
            continue  # declared by a replay kernel: tiletune.kernels.declarations warns
        try:
            kernels.update(family_kernels(family))
        except Exception as error:  # a broken plugin must not break the built-ins
            warnings.warn(f"skipping kernel plugin family {family.name!r}: {error}", stacklevel=2)
    return kernels


@cache
def all_kernels() -> dict[str, KernelSpec]:
    """Built-ins, the replay kernels when ``$TILETUNE_REPLAY_KERNELS`` is set, the plugin families
    (``tiletune.families``), then the older group's plugin kernels (``tiletune.kernels``). Read
    once per process."""
    kernels: dict[str, KernelSpec] = {**builtin_kernels(), **registered_replay_kernels()}
    kernels.update(_plugin_family_kernels(frozenset(kernels)))
    for entry in importlib.metadata.entry_points(group=KERNELS_ENTRY_POINT_GROUP):
        try:
            spec = _as_spec(entry.load(), f"entry point {entry.name} ({entry.value})")
        except Exception as error:  # a broken plugin must not break the built-ins
            warnings.warn(f"skipping kernel plugin {entry.name!r}: {error}", stacklevel=2)
            continue
        if spec.name in kernels:
            warnings.warn(f"skipping kernel plugin {entry.name!r}: name {spec.name!r} is taken", stacklevel=2)
            continue
        kernels[spec.name] = spec
    return kernels


def get_kernel(name: str) -> KernelSpec:
    """The kernel called ``name``; raises :class:`UnknownKernelError` listing the known ones."""
    kernels = all_kernels()
    try:
        return kernels[name]
    except KeyError:
        raise UnknownKernelError(name, list(kernels)) from None


def runs_on(spec: KernelSpec, device_kind: str) -> bool:
    """Whether a device of ``device_kind`` runs ``spec``: its ``supports`` says so, and replay
    kernels go with replay devices alone (the portable kernels support every kind, but a replay
    device has nothing to run them on)."""
    return spec.supports(device_kind) and is_replay_kernel(spec) == (device_kind == REPLAY_KIND)


def kernels_for(device_kind: str) -> dict[str, KernelSpec]:
    """The registered kernels a device of ``device_kind`` runs (:func:`runs_on`), by name."""
    return {name: spec for name, spec in all_kernels().items() if runs_on(spec, device_kind)}
