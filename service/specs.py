"""The kernels' specs as the service reads requests with them: names, shapes and dtypes checked.

Every refusal is an :class:`~tiletune.service.errors.InvalidInputError` naming the field.
Imports the kernels' specs (never runs a kernel) and the wire's vocabularies.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from tiletune.client.knobs import CLAMP_RULES, allowed_values
from tiletune.client.wire import DTYPES, KernelInfo
from tiletune.kernels import KernelSpec, Shape, get_kernel
from tiletune.kernels.errors import InputError
from tiletune.kernels.spec import parse_dims
from tiletune.service.errors import InvalidInputError


def lookup_kernel(name: str, field: str = "kernel") -> KernelSpec:
    """The registered kernel ``name``; :class:`InvalidInputError` naming ``field`` otherwise."""
    try:
        return get_kernel(name)
    except InputError as error:
        raise InvalidInputError(error.reason, field=field) from error


def knob_values_of(spec: KernelSpec, shape: Shape) -> dict[str, list[int]]:
    """Each knob's values for ``shape``, as a lookup answer carries them (the client checks configs)."""
    return {name: list(values) for name, values in spec.knob_values(shape).items()}


def check_dtype(dtype: str, field: str = "dtype") -> str:
    """``dtype`` if it is one of the wire's dtypes; :class:`InvalidInputError` naming ``field`` otherwise."""
    if dtype not in DTYPES:
        raise InvalidInputError(f"unknown dtype {dtype!r}; choose one of {list(DTYPES)}", field=field)
    return dtype


def parse_shape(spec: KernelSpec, shape: Mapping[str, object], field: str = "shape") -> Shape:
    """``shape`` checked against ``spec``; errors name ``field`` and the dim (``shapes[0].n``).

    Dims are bounded to what the databases hold and each tensor of a call to
    :data:`~tiletune.kernels.spec.MAX_TENSOR_BYTES` (:meth:`KernelSpec.parse_shape`): a
    refusal of the latter names ``field``, the tensor and its bytes. The same check for a
    lookup, a sweep, a miss report and an import, whatever their dtype.
    """
    try:
        return spec.parse_shape(dict(shape))
    except InputError as error:
        raise InvalidInputError(error.reason, field=error.field.replace("shape", field, 1)) from error


def parse_key(kernel: str, shape_text: str, dtype: str) -> tuple[KernelSpec, Shape]:
    """The spec and parsed shape of a key given as text (a lookup's query)."""
    spec = lookup_kernel(kernel)
    try:
        dims = parse_dims(shape_text)
    except InputError as error:
        raise InvalidInputError(error.reason, field=error.field) from error
    shape = parse_shape(spec, dims)
    check_dtype(dtype)
    return spec, shape


def kernel_info(spec: KernelSpec) -> KernelInfo:
    """What a client needs of a kernel: name, version, dims in spec order, categorical dims, knobs,
    and the knobs' values with the rule that clamps them (:mod:`tiletune.client.knobs`).

    The rule is the one of :data:`~tiletune.client.knobs.CLAMP_RULES` that reproduces
    ``spec.knob_values`` on every probe shape; a kernel that follows none (a plugin's own
    rule) is sent without values, so clients check its knob names alone.
    """
    knobs = [knob.name for knob in spec.knobs]
    rule = _clamp_rule(spec)
    return KernelInfo(
        name=spec.name,
        version=spec.version,
        dims=[dim.name for dim in spec.dims],
        categorical=[dim.name for dim in spec.dims if dim.categorical],
        knobs=knobs,
        knob_values={knob.name: list(knob.values) for knob in spec.knobs} if rule is not None else None,
        clamp_to={knob.name: knob.clamp_to for knob in spec.knobs if knob.clamp_to is not None},
        clamp_rule=rule or "min",
    )


#: Sizes every size dim takes in turn when the clamp rule of a kernel is found out.
PROBE_SIZES = (1, 2, 3, 5, 7, 15, 16, 17, 31, 100, 255, 256, 257, 1000, 4097, 65537, 1 << 20, 5_000_001)


@functools.cache
def _clamp_rule(spec: KernelSpec) -> str | None:
    """The clamp rule that gives ``spec.knob_values`` on every probe shape, or ``None``."""
    probes = [
        {dim.name: (dim.choices[0] if dim.choices else size) for dim in spec.dims} for size in PROBE_SIZES
    ]
    for rule in CLAMP_RULES:
        info = KernelInfo(
            name=spec.name,
            version=spec.version,
            dims=[dim.name for dim in spec.dims],
            knobs=[knob.name for knob in spec.knobs],
            knob_values={knob.name: list(knob.values) for knob in spec.knobs},
            clamp_to={knob.name: knob.clamp_to for knob in spec.knobs if knob.clamp_to is not None},
            clamp_rule=rule,
        )
        try:
            if all(_same_values(info, spec, shape) for shape in probes):
                return rule
        except Exception:  # a plugin's knob_values that fails on a probe: no rule
            return None
    return None


def _same_values(info: KernelInfo, spec: KernelSpec, shape: Shape) -> bool:
    """Whether the client's values of ``info`` for ``shape`` are the spec's (as sets)."""
    ours = allowed_values(info, shape)
    theirs = spec.knob_values(shape)
    return ours is not None and {k: set(v) for k, v in ours.items()} == {k: set(v) for k, v in theirs.items()}
