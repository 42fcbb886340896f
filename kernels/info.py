"""What a client needs to know of a declared kernel to check and pick among its tuned configs without
the kernel's code: its :class:`~tiletune.client.wire.KernelInfo` (name, version, dims, knobs and the
knobs' values with their clamp rule). Bundles carry one per kernel: the server's exports and the
files local tuning writes. Torch-free.
"""

from __future__ import annotations

from tiletune.client.space import CLAMP_MIN, DeviceLimits, candidates
from tiletune.client.wire import KernelInfo
from tiletune.kernels.declaration import KernelDeclaration


def kernel_info(spec: KernelDeclaration, limits: DeviceLimits | None = None) -> KernelInfo:
    """What a client needs of a kernel: name, version, dims in spec order, categorical dims, knobs,
    and the knobs' values with the rule that clamps them (:mod:`tiletune.client.knobs`).

    The values are the candidates on a chip of ``limits`` (a knob declared ``up_to`` a limit they
    know runs up to it; :func:`tiletune.client.space.candidates`). The rule is the one the
    kernel's tile knobs declare (:class:`~tiletune.client.space.Knob`'s
    ``clamp``). A kernel whose values follow no single declared rule (tile knobs declaring
    different rules, or a plugin that overrides ``knob_values`` with code of its own) is sent
    without values, so clients check its knob names alone.
    """
    rule = declared_clamp_rule(spec)
    return KernelInfo(
        name=spec.name,
        version=spec.version,
        dims=[dim.name for dim in spec.dims],
        categorical=[dim.name for dim in spec.dims if dim.categorical],
        knobs=[knob.name for knob in spec.knobs],
        knob_values={knob.name: list(candidates(knob, limits)) for knob in spec.knobs} if rule else None,
        clamp_to={knob.name: knob.clamp_to for knob in spec.knobs if knob.clamp_to is not None},
        clamp_rule=rule or CLAMP_MIN,
        dim_defaults={dim.name: dim.default for dim in spec.dims if dim.default is not None},
    )


def declared_clamp_rule(spec: KernelDeclaration) -> str | None:
    """The clamp rule all of ``spec``'s tile knobs declare (``min`` when none is a tile knob), or
    ``None`` when its values are not the declared rules' (see :func:`kernel_info`)."""
    if type(spec).knob_values is not KernelDeclaration.knob_values:
        return None
    rules = {knob.clamp for knob in spec.knobs if knob.clamp_to is not None}
    if len(rules) > 1:
        return None
    return rules.pop() if rules else CLAMP_MIN
