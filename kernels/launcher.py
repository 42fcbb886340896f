"""Launch a kernel with the config tuned for this call: the runtime half of tiletune in a kernel.

::

    from tiletune.client import ConfigClient
    from tiletune.kernels import launch

    tiling = ConfigClient("http://tuner:8642", chip="auto")
    out = launch("fused_attention", q, k, v, client=tiling, causal=True)

One call does what a hand-written launcher did with its tiling heuristic:

1. the shape is read from the tensors (:meth:`KernelSpec.shape_of`); dims the
   tensors cannot tell (categorical ones such as ``causal``) are given by
   keyword, and a keyword for a size dim must agree with the tensors;
2. the dtype is the tensors' (``dtype=`` names it when they mix dtypes);
3. the config is asked of ``client`` (any :class:`ConfigSource`: the
   ``ConfigClient`` of :mod:`tiletune.client`, or a test's stand-in);
4. the config is checked against the kernel's space and the constraints of
   the chip the tensors live on; when it is missing, malformed or invalid, or
   the client raised, the kernel's default config is used instead (logged once
   per call key): a config never fails the caller. The vendor config (torch's
   op) is one of the space's where torch has an op for the call;
5. the kernel runs under it (:func:`~tiletune.kernels.vendor.run_config`: torch's
   op for the vendor config, else ``spec.run``).

Bad *inputs* (tensors that do not fit the kernel, an unknown dim, an
unsupported dtype) still raise :class:`~tiletune.kernels.errors.InputError`
naming the field: they are the caller's bug, not a tuning matter.

:func:`select_config` is steps 1-4 alone, for callers that run their own
implementation (they get a tiled config: the default where the answer is torch's op, unless
they say they run it); :func:`tiled` wraps such an implementation as a decorator.

Imports no client internals: a client is anything with a matching ``get``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar

import torch

from tiletune.client.space import is_vendor
from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.device import get_device
from tiletune.kernels.errors import InputError, ShapeError
from tiletune.kernels.native.spec import preferred_backend
from tiletune.kernels.registry import get_kernel
from tiletune.kernels.spec import DeviceLimits, KernelSpec, dtype_name, torch_dtype
from tiletune.kernels.vendor import run_config, vendor_op

logger = logging.getLogger(__name__)

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")

#: Distinct (kernel, shape, dtype, chip limits, config) checks remembered; a launch path sees few.
CHECK_CACHE_SIZE = 4096


class TunedConfig(Protocol):
    """What a :class:`ConfigSource` returns: at least the config (knob name -> value)."""

    @property
    def config(self) -> Mapping[str, int]:
        """The config to launch with."""


class ConfigSource(Protocol):
    """Where :func:`launch` gets configs: ``tiletune.client.ConfigClient`` is one.

    ``get`` is called as ``get(kernel_name, shape, dtype=dtype_name)`` on every
    launch (the client answers from its in-process cache).
    """

    def get(self, kernel: str, shape: Mapping[str, int], /, *, dtype: str) -> TunedConfig:
        """The config for ``kernel`` at ``shape`` and ``dtype`` on the client's chip."""


@dataclass(frozen=True)
class Selection:
    """The config :func:`select_config` chose for one call, and why.

    ``source`` is ``"client"`` when the client's config was valid and used,
    ``"default"`` when the kernel's default replaced it (``reason`` says why).
    ``measured``: the config used is a measured answer, tuned for this key or a nearest one (the
    client's ``match`` is not ``default``; a source whose answers carry no ``match`` counts as
    measured); False for a kernel's rule, whoever gave it.
    """

    spec: KernelSpec
    shape: Shape
    dtype: str
    config: Config
    source: Literal["client", "default"]
    reason: str | None = None
    measured: bool = False


def _spec(kernel: str | KernelSpec) -> KernelSpec:
    return kernel if isinstance(kernel, KernelSpec) else get_kernel(kernel)


_Layout = tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]
_ShapeKey = tuple[type, str, _Layout, tuple[tuple[str, object], ...]]
_shapes: dict[_ShapeKey, Shape] = {}
_DefaultKey = tuple[type, str, int, tuple[tuple[str, int], ...], str, DeviceLimits]
_defaults: dict[_DefaultKey, Config] = {}


def _remembered(cache: dict[K, V], key: K, make: Callable[[], V]) -> V:
    """``cache[key]``, made by ``make()`` the first time (a cache of :data:`CHECK_CACHE_SIZE` entries
    at most, emptied when full: a launch path sees few keys)."""
    known = cache.get(key)
    if known is None:
        if len(cache) >= CHECK_CACHE_SIZE:
            cache.clear()
        known = cache[key] = make()
    return known


def _call_shape(spec: KernelSpec, tensors: tuple[torch.Tensor, ...], dims: Mapping[str, object]) -> Shape:
    """The tensors' shape, completed by keyword dims; a size dim given by keyword must agree.
    Remembered per kernel, tensor sizes and strides and keyword dims (what ``shape_of`` reads)."""
    layout = tuple((tuple(t.shape), t.stride()) for t in tensors)
    key = (type(spec), spec.name, layout, tuple(dims.items()))
    shape: Shape = _remembered(_shapes, key, lambda: _read_shape(spec, tensors, dims))
    return dict(shape)


def _default(spec: KernelSpec, shape: Shape, dtype: str, limits: DeviceLimits) -> Config:
    """The kernel's default config for a call (its rule), remembered per kernel, shape, dtype and chip."""
    key = (type(spec), spec.name, spec.version, tuple(shape.items()), dtype, limits)
    config: Config = _remembered(_defaults, key, lambda: spec.default_config(shape, dtype, limits))
    return dict(config)


def _read_shape(spec: KernelSpec, tensors: tuple[torch.Tensor, ...], dims: Mapping[str, object]) -> Shape:
    """:func:`_call_shape`, read from the tensors."""
    read = spec.shape_of(tensors)
    categorical = {d.name for d in spec.dims if d.categorical}
    given = {name: int(value) if isinstance(value, bool) else value for name, value in dims.items()}
    for name, value in given.items():
        if name in read and name not in categorical and value != read[name]:
            raise ShapeError(f"shape.{name}", f"the tensors say {read[name]}, the keyword says {value!r}")
    return spec.parse_shape({**read, **given})


def _call_dtype(tensors: tuple[torch.Tensor, ...], dtype: str | None) -> str:
    if dtype is not None:
        torch_dtype(dtype)  # an unknown name is a DTypeError naming the choices
        return dtype
    names = sorted({dtype_name(t.dtype) for t in tensors})
    if len(names) > 1:
        raise InputError("dtype", f"the tensors mix {', '.join(names)}; pass dtype= to name the call's dtype")
    return names[0]


@functools.cache
def _limits(device_kind: str) -> DeviceLimits:
    """The constraints' limits of the chip of a device kind (device 0 of that kind)."""
    return get_device(device_kind).chip.limits


def _device_kind(tensors: tuple[torch.Tensor, ...]) -> str:
    kinds = sorted({t.device.type for t in tensors})
    if len(kinds) > 1:
        raise InputError("inputs", f"the tensors are on different devices: {', '.join(kinds)}")
    return kinds[0]


ConfigItems = tuple[tuple[str, object], ...]
_CheckKey = tuple[type, str, int, tuple[tuple[str, int], ...], str, DeviceLimits, ConfigItems]
_checks: dict[_CheckKey, tuple[Config, str | None]] = {}


def _check(spec: KernelSpec, shape: Shape, dtype: str, limits: DeviceLimits, raw: ConfigItems) -> str | None:
    """Why the client's config may not run here, or None when it may (the vendor config: where
    torch has an op for the call on the chip's kind of device)."""
    try:
        config = spec.parse_config(dict(raw), shape, limits)
    except InputError as error:
        return str(error)
    if is_vendor(config) and vendor_op(spec, shape, limits.kind) is None:  # parsed: the kernel has one
        return f"torch has no op for this call on {limits.kind}"
    return spec.config_problem(config, shape, dtype, limits)


def _checked(
    spec: KernelSpec, shape: Shape, dtype: str, limits: DeviceLimits, raw: ConfigItems
) -> tuple[Config, str | None]:
    """The config to run and, when it is the default, why the client's was refused.

    Remembered per (kernel, shape, dtype, chip limits, config), so a launch pays
    for the checks once per key and a refusal is logged once.
    """
    key = (type(spec), spec.name, spec.version, tuple(shape.items()), dtype, limits, raw)
    known = _checks.get(key)
    if known is not None:
        return known
    reason = _check(spec, shape, dtype, limits, raw)
    if reason is None:
        result: tuple[Config, str | None] = (spec.parse_config(dict(raw), shape, limits), None)
    else:
        logger.warning(
            "%s %s %s: config %s refused (%s); using the default",
            spec.name,
            spec.canonical_shape(shape),
            dtype,
            dict(raw),
            reason,
        )
        result = (spec.default_config(shape, dtype, limits), reason)
    if len(_checks) >= CHECK_CACHE_SIZE:
        _checks.clear()
    _checks[key] = result
    return result


def answer_said(answer: TunedConfig) -> tuple[ConfigItems, bool]:
    """What a source's answer says, as a launch reads it: its config as hashable items, and whether
    it is a measured answer (its ``match`` is not ``default``); raises whatever the answer raises."""
    items = tuple(answer.config.items())
    hash(items)
    return items, getattr(answer, "match", None) != "default"


def _asked(client: ConfigSource, spec: KernelSpec, shape: Shape, dtype: str) -> tuple[ConfigItems, bool]:
    """:func:`answer_said` of the client's answer; raises whatever the client or its answer raises."""
    return answer_said(client.get(spec.name, shape, dtype=dtype))


def select_config(
    kernel: str | KernelSpec,
    /,
    *tensors: torch.Tensor,
    client: ConfigSource | None,
    dtype: str | None = None,
    runs_vendor: bool = False,
    **dims: int | bool,
) -> Selection:
    """Steps 1-4 of :func:`launch`: the shape, dtype and checked config of a call, without running it
    (``client`` ``None``: the kernel's default rule). ``runs_vendor``: the caller runs the vendor
    config (:func:`~tiletune.kernels.vendor.run_config`); otherwise an answer of torch's op is
    replaced by the kernel's default, a tiled config."""
    spec = _spec(kernel)
    if not tensors:
        raise InputError("inputs", f"{spec.name} needs its input tensors")
    shape = _call_shape(spec, tensors, dims)
    call_dtype = _call_dtype(tensors, dtype)
    limits = _limits(_device_kind(tensors))
    if client is None:  # no source configured: the kernel's own rule, as asked
        return Selection(spec, shape, call_dtype, _default(spec, shape, call_dtype, limits), "default")
    try:
        asked, measured = _asked(client, spec, shape, call_dtype)
    except Exception as error:  # a client that fails, or answers nonsense, never fails the launch
        logger.warning("%s: config lookup failed (%r); using the default", spec.name, error)
        default = _default(spec, shape, call_dtype, limits)
        return Selection(spec, shape, call_dtype, default, "default", f"lookup failed: {error!r}")
    config, refusal = _checked(spec, shape, call_dtype, limits, asked)
    if refusal is None and not runs_vendor and is_vendor(config):
        refusal = "the answer is torch's op, which this caller does not run"
        config = _default(spec, shape, call_dtype, limits)
    source: Literal["client", "default"] = "client" if refusal is None else "default"
    return Selection(spec, shape, call_dtype, dict(config), source, refusal, measured and refusal is None)


def launch(
    kernel: str | KernelSpec,
    /,
    *tensors: torch.Tensor,
    client: ConfigSource | None,
    dtype: str | None = None,
    **dims: int | bool,
) -> torch.Tensor:
    """Run ``kernel`` on ``tensors`` under the config ``client`` gives for their shape (see the module).

    A built-in kernel runs as its operator (``torch.ops.tiletune.<kernel>``), so its result carries
    gradients; a kernel without one refuses tensors that require grad rather than drop their
    gradient silently.

    ``kernel`` is a registered name or a spec; ``tensors`` are what the spec's
    ``run`` takes, in its order; ``dims`` complete the shape where the tensors
    cannot (``causal=True`` for ``fused_attention``). Raises ``InputError`` for
    inputs that do not fit the kernel and ``NotImplementedError`` for a kernel
    whose spec has no ``shape_of``; never because of the config.
    """
    spec = _spec(kernel)
    operator = _operator(spec)
    if operator is not None and dtype is None:
        return _launch_operator(spec, operator, tensors, client, dims)
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        raise InputError(
            "inputs",
            f"{spec.name} has no operator with a backward, so its result would carry no gradient; "
            "run it under torch.no_grad() or on tensors that do not require grad",
        )
    selection = select_config(spec, *tensors, client=client, dtype=dtype, runs_vendor=True, **dims)
    backend = preferred_backend(selection.spec, _device_kind(tensors))  # CPUs: native where built
    output = run_config(selection.spec, tensors, selection.config, selection.shape, backend)
    if not isinstance(output, torch.Tensor):  # a backward kernel: its operator's autograd runs it
        raise InputError(
            "kernel",
            f"{spec.name} returns {len(output)} tensors (a backward kernel's gradients); launch runs "
            "kernels of one output: call the forward's operator and let autograd run its backward",
        )
    return output


#: An operator: ``fused_attention`` returns ``(out, lse)``, the others one tensor.
Operator = Callable[..., torch.Tensor | tuple[torch.Tensor, ...]]


def _operator(spec: KernelSpec) -> Operator | None:
    """The ``torch.ops.tiletune`` operator of a registered built-in kernel's spec, or None."""
    from tiletune.kernels.ops import OPERATORS

    operator = OPERATORS.get(spec.name)
    return operator if operator is not None and get_kernel(spec.name) is spec else None


def _launch_operator(
    spec: KernelSpec,
    operator: Operator,
    tensors: tuple[torch.Tensor, ...],
    client: ConfigSource | None,
    dims: Mapping[str, int | bool],
) -> torch.Tensor:
    """``operator`` on ``tensors`` under ``client``: autograd and the config as :func:`launch` says.
    The tensors' dtype is checked as ever (float64, which the operator takes for gradient checks, is
    not a launch dtype); keyword size dims, unknown dims and flags out of their choices are refused
    by the shape check (the operator reads the shape itself: a call with valid flags alone is read
    once); categorical dims are the operator's flags."""
    from tiletune.kernels.ops.source import using_source

    _call_dtype(tensors, None)
    choices = {d.name: d.choices for d in spec.dims if d.choices is not None}
    arguments = _operator_flags(spec.name) & choices.keys()
    if any(
        name not in arguments or not isinstance(value, int) or int(value) not in choices[name]
        for name, value in dims.items()
    ):  # size dims by keyword, a flag out of its choices, or a flag the tensors tell: checked
        shape, told = _call_shape(spec, tensors, dims), spec.shape_of(tensors)
        for name in dims:
            if name in choices and name not in arguments and shape[name] != told[name]:
                raise ShapeError(
                    f"shape.{name}", f"the tensors say {told[name]}, the keyword says {shape[name]}"
                )
    flags = {name: int(value) for name, value in dims.items() if name in arguments}
    with using_source(client):
        result = operator(*tensors, **flags)
    return result[0] if isinstance(result, tuple) else result  # fused_attention: (out, lse)


@functools.cache
def _operator_flags(kernel: str) -> frozenset[str]:
    """The categorical dims the kernel's operator takes as arguments (``causal``); the others
    (``mask``: a tensor) the tensors tell."""
    schema = getattr(torch.ops.tiletune, kernel).default._schema
    return frozenset(argument.name for argument in schema.arguments if "Tensor" not in str(argument.type))


def tiled(
    kernel: str | KernelSpec,
    /,
    *,
    client: ConfigSource,
    dtype: str | None = None,
    **dims: int | bool,
) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Decorate an implementation ``fn(*tensors, config=...)`` so calls pick the config at launch.

    ::

        @tiled("add", client=tiling)
        def my_add(a, b, *, config):  # config: {"tile_size": ..., "buffer_num": ..., ...}
            ...

        my_add(a, b)  # config chosen as launch() would; keyword dims per call: my_add(q, k, v, causal=1)

    The tensors are read as ``launch`` reads them (the spec's ``shape_of``).
    """

    def decorate(fn: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(fn)
        def wrapper(*tensors: torch.Tensor, **call_dims: int | bool) -> T:
            given = {**dims, **call_dims}
            selection = select_config(
                kernel, *tensors, client=client, dtype=dtype, runs_vendor=False, **given
            )
            return fn(*tensors, config=selection.config)

        return wrapper

    return decorate
