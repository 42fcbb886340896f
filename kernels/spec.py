"""The kernel spec: the public contract every tunable kernel implements.

A kernel declares, once and declaratively:

- ``dims``: the named problem dims of a call (its *shape*), in canonical order;
- ``knobs``: the tuning knobs and their candidate values (the search space), each with its
  value rule declared as data (:mod:`tiletune.client.space`, torch-free, where the rules are
  evaluated for the kernels, the server and the clients alike);
- constraints: ``invalid_reason`` rejects a config before it is ever run, from
  the chip's limits (the working set must fit the local memory: UB on Ascend,
  shared memory on GPUs, L2 per core on CPUs) and the pipeline rules;
- ``default_config``: the hand-written tiling rule that tiletune replaces
  (``heuristic_tiling`` below, mapped onto the kernel's knobs);
- ``reference`` and ``make_inputs``: the correct answer for checking configs;
- implementations per backend (``run``), in which every knob changes execution;
- ``flops`` and ``bytes_moved`` for achieved GFLOP/s and GB/s;
- ``tensor_bytes`` and ``workspace_bytes``: the bytes of each tensor of a call and of what
  its bench holds besides, which bound the shapes a caller may name and a server may bench;
- ``shape_of``: the shape of a call read from its tensors, which
  :func:`tiletune.kernels.launcher` needs (optional for plugins that are only tuned).

Users tune their own operators by subclassing :class:`KernelSpec` in their own
package and registering an instance (or the class) under the entry-point group
``tiletune.kernels``; tiletune treats such kernels exactly like built-ins.

Shapes and configs are plain ``dict[str, int]`` in canonical (declaration)
order, so they serialise to JSON and key databases without translation.
"""

from __future__ import annotations

import itertools
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import torch

from tiletune.client import space, wire

# A plugin written against this contract imports the declaration's types from here too.
from tiletune.client.space import DeviceLimits as DeviceLimits  # noqa: PLC0414
from tiletune.client.space import Dim as Dim  # noqa: PLC0414
from tiletune.client.space import Knob as Knob  # noqa: PLC0414
from tiletune.client.space import snap_down as snap_down  # noqa: PLC0414
from tiletune.kernels.errors import ConfigError, DTypeError, ShapeError

Shape = dict[str, int]
Config = dict[str, int]

#: The torch dtype of each of the wire's dtype names.
DTYPES: dict[str, torch.dtype] = dict(
    zip(wire.DTYPES, (torch.float32, torch.float16, torch.bfloat16), strict=True)
)

#: Bytes per element of float32, the dtype references compute in.
FLOAT32_BYTES = 4

#: The wire's widest dtype: :meth:`KernelSpec.parse_shape` counts a call's tensors in it, so
#: whether a shape is a key never depends on its dtype (a lookup, a sweep and a miss report of
#: one shape agree, whatever dtype each names).
WIDEST_DTYPE = max(wire.DTYPES, key=lambda name: DTYPES[name].itemsize)

#: The most bytes one tensor of a call may hold (1 TiB, counted in :data:`WIDEST_DTYPE`). It
#: bounds what a call really allocates, tensor by tensor, never the product of every dim (a
#: matmul's k, an attention's heads and head_dim are not allocated together): far above what one
#: device holds today (a few hundred GiB of HBM; a CPU host's tensor of more than 1 TiB is rare),
#: so every real shape of an LLM is a key, and small enough that byte counts, their sums over a
#: kernel's tensors and the dims inside them stay far below the databases' 64-bit integers.
#: What a bench may hold in all is the server's operational limit (``TILETUNE_MAX_SHAPE_BYTES``).
MAX_TENSOR_BYTES = 1 << 40

_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype for a dtype name; raises :class:`DTypeError` naming the choices."""
    try:
        return DTYPES[name]
    except KeyError:
        raise DTypeError("dtype", f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)}") from None


def dtype_name(dtype: torch.dtype) -> str:
    """The dtype name of a torch dtype; raises :class:`DTypeError` naming the supported ones."""
    for name, candidate in DTYPES.items():
        if candidate == dtype:
            return name
    raise DTypeError("dtype", f"tensors of {dtype} are not supported; use one of {', '.join(DTYPES)}")


def element_size(dtype: str) -> int:
    """Bytes per element of a dtype name."""
    return torch_dtype(dtype).itemsize


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


def expect_inputs(kernel: str, inputs: Sequence[torch.Tensor], names: Sequence[str]) -> None:
    """Raise :class:`ShapeError` unless ``inputs`` are as many tensors as ``names`` (for ``shape_of``)."""
    if len(inputs) != len(names):
        raise ShapeError(
            "inputs", f"{kernel} takes {len(names)} tensor(s) ({', '.join(names)}), got {len(inputs)}"
        )


def expect_ndim(name: str, tensor: torch.Tensor, ndim: int, layout: str) -> None:
    """Raise :class:`ShapeError` (field ``inputs.<name>``) unless ``tensor`` has ``ndim`` dims."""
    if tensor.dim() != ndim:
        raise ShapeError(f"inputs.{name}", f"must be {layout}, got a tensor of size {list(tensor.shape)}")


def expect_size(name: str, got: int, expected: int, what: str) -> None:
    """Raise :class:`ShapeError` (field ``inputs.<name>``) unless a size read from it matches."""
    if got != expected:
        raise ShapeError(f"inputs.{name}", f"{what} is {got}, expected {expected}")


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


class KernelSpec(ABC):
    """A tunable kernel. Subclasses set the class attributes and the abstract methods.

    Contract:

    - ``parse_shape`` and ``parse_config`` accept exactly the declared dims and
      knobs and raise :class:`ShapeError` / :class:`ConfigError` naming the field.
    - ``invalid_reason`` returns ``None`` for a config that may run on a chip
      with ``limits``, else a human reason; nothing invalid is ever run.
    - ``space`` lists every valid config for a shape, dtype and chip, in a
      stable order; ``default_config`` is a member of the knob values for the
      shape (it may still be invalid on an unusually small chip).
    - ``run`` returns the same result as ``reference`` (within ``tolerance``)
      for every valid config, including shapes the tiles do not divide.
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
    tolerances: Mapping[str, Tolerance] = DEFAULT_TOLERANCES

    # -- shapes and configs -------------------------------------------------

    def parse_shape(self, raw: Mapping[str, object]) -> Shape:
        """Validate a shape: every dim present, no extras, known choices, sizes in ``[1, MAX_DIM]``,
        and each tensor of a call within :data:`MAX_TENSOR_BYTES` (:meth:`check_tensor_bytes`)."""
        names = [d.name for d in self.dims]
        missing = [n for n in names if n not in raw]
        if missing:
            raise ShapeError("shape", f"{self.name} needs dims {names}; missing {missing}")
        extra = [k for k in raw if k not in names]
        if extra:
            raise ShapeError("shape", f"{self.name} has no dim(s) {extra}; its dims are {names}")
        shape: Shape = {}
        for dim in self.dims:
            value = raw[dim.name]
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
        (:meth:`knob_values`); canonical knob order."""
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

    def shape_of(self, inputs: Sequence[torch.Tensor]) -> Shape:
        """The shape of a call on ``inputs`` (the tensors ``run`` takes, in its order).

        Size dims are read from the tensors; a dim the tensors cannot tell (a
        categorical one such as ``causal``) takes the value the kernel documents
        (``launch`` lets the caller override it by keyword). Raises
        :class:`ShapeError` naming the input at fault when the tensors do not
        fit together. Built-in kernels implement it; the base raises
        ``NotImplementedError``, so a plugin kernel is tunable without it but
        launchable only once it overrides this method.
        """
        raise NotImplementedError(
            f"kernel {self.name!r} ({type(self).__name__}) does not implement shape_of(inputs), which "
            "tiletune.kernels.launcher needs to read a call's shape from its tensors; "
            "override KernelSpec.shape_of in the kernel's spec"
        )

    def canonical_shape(self, shape: Shape) -> str:
        """The shape's canonical string, dims in spec order: ``m=64,n=64,k=64``."""
        return ",".join(f"{d.name}={shape[d.name]}" for d in self.dims)

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

    def space(self, shape: Shape, dtype: str, limits: DeviceLimits) -> list[Config]:
        """Every valid config for this shape, dtype and chip, in a stable order."""
        values = self.knob_values(shape, limits)
        names = list(values)
        configs = (dict(zip(names, combo, strict=True)) for combo in itertools.product(*values.values()))
        return [c for c in configs if self.invalid_reason(c, shape, dtype, limits) is None]

    @abstractmethod
    def default_config(self, shape: Shape, dtype: str, limits: DeviceLimits) -> Config:
        """The hand-written rule's config (``heuristic_tiling`` mapped onto the knobs)."""

    # -- execution ----------------------------------------------------------

    @abstractmethod
    def make_inputs(
        self, shape: Shape, dtype: str, device: torch.device, seed: int = 0
    ) -> tuple[torch.Tensor, ...]:
        """Deterministic random inputs for ``shape`` on ``device``."""

    @abstractmethod
    def reference(self, inputs: Sequence[torch.Tensor], shape: Shape) -> torch.Tensor:
        """The correct result, computed the plain way (in float32 or better where it matters)."""

    @abstractmethod
    def run(
        self, inputs: Sequence[torch.Tensor], config: Config, shape: Shape, backend: str = "torch"
    ) -> torch.Tensor:
        """Run the kernel under ``config`` with the implementation ``backend``."""

    def backends(self) -> tuple[str, ...]:
        """Implementation names ``run`` accepts; the portable one is ``"torch"``."""
        return ("torch",)

    def supports(self, device_kind: str) -> bool:
        """Whether ``run`` can run on a device of ``device_kind`` (``cpu``, ``cuda``, ``npu``) here.

        The portable PyTorch kernels run everywhere (True); a kernel whose
        implementation needs a compiler or runtime (Triton, triton-ascend) says
        whether that is installed and usable for the kind.
        """
        return True

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
