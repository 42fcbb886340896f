"""The kernels' declarations as the service reads requests with them: names, shapes and dtypes checked.

Every refusal is an :class:`~tiletune.service.errors.InvalidInputError` naming the field.
Imports the kernels' declarations (torch-free; never an implementation) and the wire's vocabularies.
"""

from __future__ import annotations

from collections.abc import Mapping

from tiletune.client.space import DeviceLimits, vendor_config
from tiletune.client.wire import DTYPES
from tiletune.kernels import Config, KernelDeclaration, Shape, get_declaration
from tiletune.kernels.declaration import parse_dims
from tiletune.kernels.errors import InputError, UnknownKernelError
from tiletune.service.errors import InvalidInputError


def lookup_kernel(name: str, field: str = "kernel") -> KernelDeclaration:
    """The registered kernel ``name``; :class:`InvalidInputError` naming ``field`` otherwise."""
    try:
        return get_declaration(name)
    except InputError as error:
        raise InvalidInputError(error.reason, field=field) from error


def knob_values_of(
    spec: KernelDeclaration, shape: Shape, limits: DeviceLimits | None
) -> dict[str, list[int]]:
    """Each knob's values for ``shape`` on a chip of ``limits``, as a lookup answer carries them (the
    client checks configs)."""
    return {name: list(values) for name, values in spec.knob_values(shape, limits).items()}


def chip_dependent(spec: KernelDeclaration) -> bool:
    """Whether ``spec``'s values depend on the chip's limits (a knob declared ``up_to`` one)."""
    return any(knob.up_to is not None for knob in spec.knobs)


def check_dtype(dtype: str, field: str = "dtype") -> str:
    """``dtype`` if it is one of the wire's dtypes; :class:`InvalidInputError` naming ``field`` otherwise."""
    if dtype not in DTYPES:
        raise InvalidInputError(f"unknown dtype {dtype!r}; choose one of {list(DTYPES)}", field=field)
    return dtype


def parse_shape(spec: KernelDeclaration, shape: Mapping[str, object], field: str = "shape") -> Shape:
    """``shape`` checked against ``spec``; errors name ``field`` and the dim (``shapes[0].n``).

    Dims are bounded to what the databases hold and each tensor of a call to
    :data:`~tiletune.kernels.declaration.MAX_TENSOR_BYTES` (:meth:`KernelDeclaration.parse_shape`): a
    refusal of the latter names ``field``, the tensor and its bytes. The same check for a
    lookup, a sweep, a miss report and an import, whatever their dtype.
    """
    try:
        return spec.parse_shape(dict(shape))
    except InputError as error:
        raise InvalidInputError(error.reason, field=error.field.replace("shape", field, 1)) from error


def parse_key(kernel: str, shape_text: str, dtype: str) -> tuple[KernelDeclaration, Shape]:
    """The spec and parsed shape of a key given as text (a lookup's query)."""
    spec = lookup_kernel(kernel)
    try:
        dims = parse_dims(shape_text)
    except InputError as error:
        raise InvalidInputError(error.reason, field=error.field) from error
    shape = parse_shape(spec, dims)
    check_dtype(dtype)
    return spec, shape


def vendor_finalist(kernel: str) -> Config | None:
    """The vendor config (torch's op) where ``kernel`` declares one: a finalist of its jobs'
    validation runs and the judge's baseline there (a worker that cannot run it reports it failed,
    and the default is the baseline again); None otherwise, or for a kernel no longer declared."""
    try:
        declaration = get_declaration(kernel)
    except UnknownKernelError:
        return None
    return vendor_config() if declaration.has_vendor else None
