"""A kernel's declaration: its tuning space and its counts, torch-free.

What the server, the search, the clients and the kernels share about a kernel, without its
implementation: a :class:`KernelDeclaration` declares, once,

- ``dims``: the named problem dims of a call (its *shape*), in canonical order;
- ``knobs``: the tuning knobs, each with its value rule declared as data
  (:mod:`tiletune.client.space`, where the rules are evaluated for everyone);
- ``implementations``: the backends the kernel has anywhere (``torch``, ``native``, ``triton``);
  which of them a machine can run is its spec's business (:meth:`KernelSpec.backends`);
- constraints: ``invalid_reason`` rejects a config before it is ever run, from the chip's
  :class:`DeviceLimits` (the working set must fit the local memory: UB on Ascend, shared
  memory on GPUs, L2 per core on CPUs) and the pipeline rules;
- ``default_config``: the hand-written tiling rule that tiletune replaces (``heuristic_tiling``
  below, mapped onto the kernel's knobs);
- ``flops`` and ``bytes_moved`` for achieved GFLOP/s and GB/s; ``tensor_bytes`` and
  ``workspace_bytes``: the bytes of each tensor of a call and of what its bench holds besides,
  which bound the shapes a caller may name and a server may bench;
- ``tolerances``: how close a run must come to the reference, per dtype;
- ``build_knobs``: the knobs fixed at build time (a config is then a build), none by default;
- ``has_vendor``: whether torch's own op is one of its implementations, a candidate like any
  config (:data:`~tiletune.client.space.VENDOR_CONFIG`, no knobs): measured in the validation run
  beside the tiled configs and chosen when none beats it (:mod:`tiletune.kernels.vendor` runs it).

The torch half (inputs, reference, run, the backends built here) is
:class:`tiletune.kernels.spec.KernelSpec`, which subclasses this one. A server imports only
declarations (:mod:`tiletune.kernels.declarations`) and never torch: nothing here may depend on
the machine it runs on; what varies by chip comes in through :class:`DeviceLimits`.

Shapes and configs are plain ``dict[str, int]`` in canonical (declaration) order, so they
serialise to JSON and key databases without translation.
"""

from __future__ import annotations

import itertools
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from tiletune.client import space, wire
from tiletune.client.space import DTYPE_BYTES, DeviceLimits, Dim, Knob, is_vendor, vendor_config
from tiletune.kernels.errors import ConfigError, DTypeError, ShapeError

Shape = dict[str, int]
Config = dict[str, int]

#: The portable implementation's name: the tiled PyTorch pipeline, which runs everywhere.
PORTABLE_BACKEND = "torch"

#: Bytes per element of float32, the dtype references compute in.
FLOAT32_BYTES = DTYPE_BYTES["float32"]

#: The wire's widest dtype: :meth:`KernelDeclaration.parse_shape` counts a call's tensors in it,
#: so whether a shape is a key never depends on its dtype (a lookup, a sweep and a miss report of
#: one shape agree, whatever dtype each names).
WIDEST_DTYPE = max(wire.DTYPES, key=lambda name: DTYPE_BYTES[name])

#: The most bytes one tensor of a call may hold (1 TiB, counted in :data:`WIDEST_DTYPE`). It
#: bounds what a call really allocates, tensor by tensor, never the product of every dim (a
#: matmul's k, an attention's heads and head_dim are not allocated together): far above what one
#: device holds today (a few hundred GiB of HBM; a CPU host's tensor of more than 1 TiB is rare),
#: so every real shape of an LLM is a key, and small enough that byte counts, their sums over a
#: kernel's tensors and the dims inside them stay far below the databases' 64-bit integers.
#: What a bench may hold in all is the server's operational limit (``TILETUNE_MAX_SHAPE_BYTES``).
MAX_TENSOR_BYTES = 1 << 40

_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def element_size(dtype: str) -> int:
    """Bytes per element of a dtype name; raises :class:`DTypeError` naming the choices."""
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise DTypeError(
            "dtype", f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPE_BYTES)}"
        ) from None


def float32_copies(dtype: str, **elements: int) -> dict[str, int]:
    """The float32 copies a reference makes of tensors of ``dtype`` (``.float()``), by name.

    ``elements`` gives each tensor's element count; the copies are named ``<name>_float32``.
    None for float32 itself, where ``.float()`` is the tensor.
    """
    if element_size(dtype) >= FLOAT32_BYTES:
        return {}
    return {f"{name}_float32": count * FLOAT32_BYTES for name, count in elements.items()}


def format_bytes(count: float) -> str:
    """A byte count for people, in binary units: ``512 B``, ``1.5 GiB``, ``4.0 TiB``."""
    unit = 0
    while abs(count) >= 1024 and unit < len(_BYTE_UNITS) - 1:
        count /= 1024
        unit += 1
    return f"{count:.0f} B" if unit == 0 else f"{count:.1f} {_BYTE_UNITS[unit]}"


def _whole_bytes(count: float) -> int:
    """A float byte count as whole bytes (rounded up); ``OverflowError``/``ValueError`` when not finite."""
    return math.ceil(count)


def parse_dims(text: str) -> dict[str, object]:
    """``"m=64,n=32"`` -> ``{"m": 64, "n": 32}`` (:func:`tiletune.client.wire.parse_dims`).

    Raises :class:`ShapeError` on bad syntax.
    """
    try:
        return wire.parse_dims(text)
    except wire.ShapeTextError as error:
        raise ShapeError(error.field, error.reason) from None


@dataclass(frozen=True)
class HeuristicTiling:
    """The output of the hand-written rule, before a kernel maps it onto its knobs."""

    tile_elements: int
    buffer_num: int
    pipeline_depth: int


def heuristic_tiling(total_elements: int, element_bytes: int, local_memory_bytes: int) -> HeuristicTiling:
    """The hand-written dynamic tiling rule tiletune replaces, taken faithfully.

    - ``total_elements <= 1024``: one tile of everything, 1 buffer, depth 1;
    - ``<= 65536``: tile 256, 2 buffers (double buffering), depth 2;
    - larger: tile 1024, 2 buffers, depth 3, falling back to tile 512 when
      ``tile * element size * buffers`` exceeds a third of the local memory.
    """
    if total_elements <= 1024:
        return HeuristicTiling(total_elements, 1, 1)
    if total_elements <= 65536:
        return HeuristicTiling(256, 2, 2)
    tile, buffers = 1024, 2
    if tile * element_bytes * buffers > local_memory_bytes // 3:
        tile = 512
    return HeuristicTiling(tile, buffers, 3)


def pow2_floor(value: float) -> int:
    """The largest power of two <= value (1 for values below 2)."""
    return 1 << max(0, math.floor(math.log2(max(value, 1.0))))


BUFFER_NUM = Knob(
    "buffer_num",
    (1, 2, 3, 4),
    "preallocated rotating workspace buffers per queue (2 = double buffering)",
)
PIPELINE_DEPTH = Knob(
    "pipeline_depth",
    (1, 2, 3),
    "tiles in flight through copy-in -> compute -> copy-out "
    "(1 sequential, 2 copy-in overlaps compute, 3 copy-out overlaps too)",
)


@dataclass(frozen=True)
class Tolerance:
    """Absolute and relative tolerance of a check against the reference."""

    atol: float
    rtol: float


DEFAULT_TOLERANCES: Mapping[str, Tolerance] = MappingProxyType(
    {
        "float32": Tolerance(1e-4, 1e-4),
        "float16": Tolerance(2e-2, 2e-2),
        "bfloat16": Tolerance(5e-2, 5e-2),
    }
)


class KernelDeclaration(ABC):
    """A tunable kernel's declaration. Subclasses set the class attributes and the abstract methods.

    Contract:

    - ``parse_shape`` and ``parse_config`` accept exactly the declared dims (a dim with a
      ``default`` may be left out) and knobs and raise :class:`ShapeError` /
      :class:`ConfigError` naming the field.
    - ``invalid_reason`` returns ``None`` for a config that may run on a chip
      with ``limits``, else a human reason; nothing invalid is ever run.
    - ``space`` lists every valid config for a shape, dtype and chip, in a
      stable order; ``default_config`` is a member of the knob values for the
      shape (it may still be invalid on an unusually small chip).
    - ``implementations`` names every backend the kernel has, on any machine; a job may
      name one of them, and only a worker whose spec runs it leases that job.
    - With ``has_vendor``, :data:`~tiletune.client.space.VENDOR_CONFIG` (torch's own op) is a
      config of every shape: ``parse_config`` accepts it and :meth:`config_problem` finds none in
      it (``invalid_reason``, which a kernel overrides for its tiles, never sees it). ``space``
      lists the tiled configs alone: the search explores tiles; the vendor config is a finalist.
    - ``tensor_bytes`` names each tensor of one call (its inputs and its output)
      with its bytes; a shape is a key only if each holds at most
      :data:`MAX_TENSOR_BYTES` in :data:`WIDEST_DTYPE`. ``workspace_bytes`` names
      what a bench holds besides (the reference's result, its float32 copies and
      intermediates); ``allocated_bytes``, their sum, is what the server bounds a
      sweep's shapes by (``TILETUNE_MAX_SHAPE_BYTES``). A spec that declares no
      tensors (a plugin written before they were declared) is counted from its
      ``bytes_moved``: its inputs and output as one tensor, ``inputs_and_output``
      (conservative: the bound applies to their sum), and a ``reference`` of
      ``bytes_moved`` in float32 (its float32 copies of the inputs, its float32 result).
    """

    name: str
    version: int
    description: str
    dims: tuple[Dim, ...]
    knobs: tuple[Knob, ...]
    implementations: tuple[str, ...] = (PORTABLE_BACKEND,)
    tolerances: Mapping[str, Tolerance] = DEFAULT_TOLERANCES
    #: The kernel that computes this one's gradients, keyed by this one's shape (``softmax`` →
    #: ``softmax_backward``); None where the backward needs no kernel of its own (``add``) or is
    #: other kernels' calls (``matmul``: see :meth:`backward_keys`).
    backward_kernel: str | None = None
    #: The knobs fixed when the kernel is built (template parameters: each of their combinations is a
    #: build, :mod:`tiletune.kernels.build_cache`); the others are passed at run time. To the server,
    #: the search and the clients they are knobs like any other.
    build_knobs: tuple[str, ...] = ()
    #: Whether torch's own op is one of the kernel's implementations (see the contract above).
    has_vendor: bool = False

    # -- shapes and configs -------------------------------------------------

    def parse_shape(self, raw: Mapping[str, object]) -> Shape:
        """Validate a shape: every dim present, no extras, known choices, sizes in ``[1, MAX_DIM]``,
        and each tensor of a call within :data:`MAX_TENSOR_BYTES` (:meth:`check_tensor_bytes`)."""
        names = [d.name for d in self.dims]
        missing = [d.name for d in self.dims if d.name not in raw and d.default is None]
        if missing:
            raise ShapeError("shape", f"{self.name} needs dims {names}; missing {missing}")
        extra = [k for k in raw if k not in names]
        if extra:
            raise ShapeError("shape", f"{self.name} has no dim(s) {extra}; its dims are {names}")
        shape: Shape = {}
        for dim in self.dims:
            value = raw[dim.name] if dim.name in raw else self._dim_default(dim, shape)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ShapeError(f"shape.{dim.name}", f"must be an integer, got {value!r}")
            if dim.choices is not None:
                if value not in dim.choices:
                    raise ShapeError(f"shape.{dim.name}", f"must be one of {list(dim.choices)}, got {value}")
            elif value <= 0:
                raise ShapeError(f"shape.{dim.name}", f"must be a positive integer, got {value}")
            elif value > wire.MAX_DIM:
                raise ShapeError(f"shape.{dim.name}", f"must be at most {wire.MAX_DIM} (2^40), got {value}")
            shape[dim.name] = value
        self.check_tensor_bytes(shape)
        return shape

    @staticmethod
    def _dim_default(dim: Dim, shape: Shape) -> int:
        """A left-out dim's value: its ``default``, or the value of the earlier dim it names
        (``KeyError`` for a dim without a default)."""
        if dim.default is None:
            raise KeyError(dim.name)
        return shape[dim.default] if isinstance(dim.default, str) else dim.default

    def check_tensor_bytes(self, shape: Shape) -> None:
        """Raise :class:`ShapeError` (field ``shape``) naming the tensor and its bytes when a tensor of
        a call of ``shape`` would hold more than :data:`MAX_TENSOR_BYTES` in :data:`WIDEST_DTYPE`."""
        try:
            sizes = self.tensor_bytes(shape, WIDEST_DTYPE)
        except (ArithmeticError, ValueError):  # a plugin's count too large for a float
            raise ShapeError(
                "shape", f"the tensors of {self.name} at this shape are too large to count"
            ) from None
        for name, size in sizes.items():
            if size > MAX_TENSOR_BYTES:
                raise ShapeError(
                    "shape",
                    f"tensor {name} would hold {format_bytes(size)} ({size} bytes in {WIDEST_DTYPE}, "
                    f"the widest dtype); at most {format_bytes(MAX_TENSOR_BYTES)} per tensor",
                )

    def knob_values(self, shape: Shape, limits: DeviceLimits | None = None) -> dict[str, tuple[int, ...]]:
        """Candidate values of each knob for this shape on a chip of ``limits``, by each knob's
        declared value rule (:func:`tiletune.client.space.knob_values`: tile knobs clamped by their
        dim, a knob declared ``up_to`` a limit running up to the chip's where ``limits`` know it).

        A spec describes its values by declaring its knobs; one that overrides this method
        instead has a rule of its own, which clients are not told (they check its knob names)."""
        return space.knob_values(self.knobs, shape, limits)

    def parse_config(
        self, raw: Mapping[str, object], shape: Shape, limits: DeviceLimits | None = None
    ) -> Config:
        """Validate a config against the knob values for ``shape`` on a chip of ``limits``
        (:meth:`knob_values`); canonical knob order. With :attr:`has_vendor`, the vendor config too."""
        if self.has_vendor and is_vendor(raw):
            return vendor_config()
        names = [k.name for k in self.knobs]
        missing = [n for n in names if n not in raw]
        extra = [k for k in raw if k not in names]
        if missing or extra:
            detail = "; ".join(
                part
                for part in (f"missing {missing}" if missing else "", f"unknown {extra}" if extra else "")
                if part
            )
            raise ConfigError("config", f"{self.name} knobs are {names}: {detail}")
        allowed = self.knob_values(shape, limits)
        config: Config = {}
        for name in names:
            value = raw[name]
            if isinstance(value, bool) or not isinstance(value, int) or value not in allowed[name]:
                raise ConfigError(
                    f"config.{name}", f"{value!r} is outside the space for this shape: {list(allowed[name])}"
                )
            config[name] = value
        return config

    def build_values(self, config: Config) -> Config:
        """The values of ``config``'s build-time knobs (:attr:`build_knobs`), which name its build;
        empty for a kernel whose knobs are all passed at run time."""
        return {name: config[name] for name in self.build_knobs}

    def canonical_shape(self, shape: Shape) -> str:
        """The shape's canonical string, dims in spec order: ``m=64,n=64,k=64`` (a left-out dim
        with a default: its default)."""
        filled = dict(shape)
        for dim in self.dims:
            if dim.name not in filled:
                filled[dim.name] = self._dim_default(dim, filled)
        return ",".join(f"{d.name}={filled[d.name]}" for d in self.dims)

    def backward_keys(self, shape: Shape) -> list[tuple[str, Shape]]:
        """The ``(kernel, shape)`` keys the backward of a call of ``shape`` looks up: a sweep with
        ``with_backward`` queues them beside the forward's. By default the :attr:`backward_kernel`
        at the forward's shape (its keys carry the forward's dims), or none."""
        return [] if self.backward_kernel is None else [(self.backward_kernel, dict(shape))]

    # -- constraints and space ----------------------------------------------

    @abstractmethod
    def working_set_bytes(self, config: Config, shape: Shape, dtype: str) -> int:
        """Local memory one core's tiles occupy under ``config`` (all buffers counted)."""

    def invalid_reason(self, config: Config, shape: Shape, dtype: str, limits: DeviceLimits) -> str | None:
        """Why ``config`` may not run on a chip with ``limits``, or None when it may.

        The base rules: a pipeline deeper than 1 needs at least two buffers to
        overlap anything; at most ``limits.max_buffer_num`` buffers; the working
        set must fit the local memory. Subclasses may add rules (call super).
        """
        buffers = config.get("buffer_num", 1)
        depth = config.get("pipeline_depth", 1)
        if depth > 1 and buffers < 2:
            return f"pipeline_depth={depth} needs buffer_num >= 2 to overlap stages"
        if buffers > limits.max_buffer_num:
            return f"buffer_num={buffers} exceeds the chip's {limits.max_buffer_num} buffers per queue"
        needed = self.working_set_bytes(config, shape, dtype)
        if needed > limits.local_memory_bytes:
            return f"working set {needed} B exceeds local memory {limits.local_memory_bytes} B"
        return None

    def config_problem(self, config: Config, shape: Shape, dtype: str, limits: DeviceLimits) -> str | None:
        """Why a parsed ``config`` may not run on a chip with ``limits``, or None when it may: the
        vendor config where the kernel has one, else :meth:`invalid_reason` (what callers outside
        the declarations ask; a kernel overrides ``invalid_reason``, never this)."""
        if is_vendor(config):
            return None if self.has_vendor else f"{self.name} has no vendor implementation (torch's op)"
        return self.invalid_reason(config, shape, dtype, limits)

    def space(self, shape: Shape, dtype: str, limits: DeviceLimits) -> list[Config]:
        """Every valid config for this shape, dtype and chip, in a stable order."""
        values = self.knob_values(shape, limits)
        names = list(values)
        configs = (dict(zip(names, combo, strict=True)) for combo in itertools.product(*values.values()))
        return [c for c in configs if self.invalid_reason(c, shape, dtype, limits) is None]

    @abstractmethod
    def default_config(self, shape: Shape, dtype: str, limits: DeviceLimits) -> Config:
        """The hand-written rule's config (``heuristic_tiling`` mapped onto the knobs)."""

    def tolerance(self, dtype: str) -> Tolerance:
        """How close ``run`` must come to ``reference`` for a config to be valid."""
        return self.tolerances[dtype]

    @abstractmethod
    def flops(self, shape: Shape) -> float:
        """Floating-point operations of one call (for GFLOP/s)."""

    @abstractmethod
    def bytes_moved(self, shape: Shape, dtype: str) -> float:
        """Bytes one call must read and write at least (for GB/s)."""

    def tensor_bytes(self, shape: Shape, dtype: str) -> dict[str, int]:
        """Bytes of each tensor of one call, by name: its inputs and its output.

        :meth:`parse_shape` refuses a shape in which one of them would hold more than
        :data:`MAX_TENSOR_BYTES` (in :data:`WIDEST_DTYPE`). The default, for a spec that declares
        none: the inputs and output as one tensor, ``inputs_and_output``, of :meth:`bytes_moved`.
        """
        return {"inputs_and_output": _whole_bytes(self.bytes_moved(shape, dtype))}

    def workspace_bytes(self, shape: Shape, dtype: str) -> dict[str, int]:
        """Bytes of each tensor a bench holds besides the call's, by name: the reference's result,
        the float32 copies it makes and its intermediates (the largest held at once).

        Bounded at sweep time through :meth:`allocated_bytes`, never a key's validity: a
        reference may need far more than the call (attention's score matrices). The default,
        for a spec that declares none: ``reference``, :meth:`bytes_moved` in float32 (the
        reference's float32 copies of the inputs and its float32 result).
        """
        widening = max(1, FLOAT32_BYTES // element_size(dtype))
        return {"reference": _whole_bytes(self.bytes_moved(shape, dtype) * widening)}

    def bench_bytes(self, shape: Shape, dtype: str) -> dict[str, int]:
        """Every tensor a bench of ``shape`` holds at once: :meth:`tensor_bytes`, then
        :meth:`workspace_bytes`."""
        return {**self.tensor_bytes(shape, dtype), **self.workspace_bytes(shape, dtype)}

    def allocated_bytes(self, shape: Shape, dtype: str) -> float:
        """Bytes a bench of ``shape`` holds at once: the sum of :meth:`bench_bytes` (the call's
        inputs and output, the reference's result and workspace); the server bounds sweeps by it."""
        return float(sum(self.bench_bytes(shape, dtype).values()))
