"""The kernels' specs as the service reads requests with them: names, shapes and dtypes checked.

Every refusal is an :class:`~tiletune.service.errors.InvalidInputError` naming the field.
Imports the kernels' specs (never runs a kernel) and the wire's vocabularies.
"""

from __future__ import annotations

from collections.abc import Mapping

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


def check_dtype(dtype: str, field: str = "dtype") -> str:
    """``dtype`` if it is one of the wire's dtypes; :class:`InvalidInputError` naming ``field`` otherwise."""
    if dtype not in DTYPES:
        raise InvalidInputError(f"unknown dtype {dtype!r}; choose one of {list(DTYPES)}", field=field)
    return dtype


def parse_shape(spec: KernelSpec, shape: Mapping[str, object], field: str = "shape") -> Shape:
    """``shape`` checked against ``spec``; errors name ``field`` and the dim (``shapes[0].n``)."""
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
    """What a client needs of a kernel: name, version, dims in spec order, categorical dims, knobs."""
    return KernelInfo(
        name=spec.name,
        version=spec.version,
        dims=[dim.name for dim in spec.dims],
        categorical=[dim.name for dim in spec.dims if dim.categorical],
        knobs=[knob.name for knob in spec.knobs],
    )
