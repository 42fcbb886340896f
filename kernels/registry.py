"""Which kernels run: a spec (the torch half) for each built-in, replay and plugin kernel.

A plugin package registers a :class:`~tiletune.kernels.spec.KernelSpec` (an instance, or a
subclass taking no arguments) under the entry-point group ``tiletune.kernels``, and its space,
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

from tiletune.kernels.declarations import BUILD_TIME_KERNELS, BUILTIN_KERNELS, KERNELS_ENTRY_POINT_GROUP
from tiletune.kernels.errors import UnknownKernelError
from tiletune.kernels.replay.declaration import REPLAY_KIND
from tiletune.kernels.replay.spec import is_replay_kernel, registered_replay_kernels
from tiletune.kernels.spec import KernelSpec

#: The implementations of each built-in kernel, each a module of its package with a ``SPEC``:
#: the portable PyTorch pipeline (named as the kernel), then the Triton kernels (``triton_*``: their
#: own knobs, block sizes, num_stages, num_warps; importing them needs no triton), then the native
#: CPU kernels (``native_*``: the portable knobs plus ``block_dim``; importing them never compiles).
IMPLEMENTATION_MODULES = ("portable", "triton", "native")


def _as_spec(obj: object, origin: str) -> KernelSpec:
    if isinstance(obj, type) and issubclass(obj, KernelSpec):
        obj = obj()
    if not isinstance(obj, KernelSpec):
        raise TypeError(f"{origin} is {type(obj).__name__}, not a KernelSpec")
    return obj


def builtin_kernels() -> dict[str, KernelSpec]:
    """The kernels shipped with tiletune, by name: the portable ones, their Triton and native versions."""
    modules = [
        f"tiletune.kernels.{kernel}.{impl}" for impl in IMPLEMENTATION_MODULES for kernel in BUILTIN_KERNELS
    ]
    specs = [_as_spec(importlib.import_module(module).SPEC, module) for module in modules]
    return {spec.name: spec for spec in specs}


def build_time_kernels() -> dict[str, KernelSpec]:
    """The kernels shipped with tiletune whose configs are builds (``compiled_matmul``), by name:
    each package's ``spec`` module (importing it compiles nothing)."""
    modules = [f"tiletune.kernels.{kernel}.spec" for kernel in BUILD_TIME_KERNELS]
    specs = [_as_spec(importlib.import_module(module).SPEC, module) for module in modules]
    return {spec.name: spec for spec in specs}


@cache
def all_kernels() -> dict[str, KernelSpec]:
    """Built-ins (the build-time ones last), the replay kernels when ``$TILETUNE_REPLAY_KERNELS`` is
    set, then plugin kernels from the ``tiletune.kernels`` entry points. Read once per process."""
    kernels: dict[str, KernelSpec] = {
        **builtin_kernels(),
        **build_time_kernels(),
        **registered_replay_kernels(),
    }
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
