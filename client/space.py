"""A kernel's tuning space as data: its dims, its knobs and each knob's declared value rule.

The one place a knob's values for a shape are defined. The kernels declare their spaces with
:class:`Dim` and :class:`Knob` (``tiletune.kernels.spec`` builds on them), the server reads
the declared rules to describe a kernel to clients (``KernelInfo.clamp_rule``), and the client
evaluates the same rules from that description to check and adapt configs without the
kernel's code. Standard library only: no torch, so a client and a server import it bare.

A knob's value rule, as data:

- ``values``: its candidates;
- ``up_to``: a limit of the chip (``"cores"``) the candidates run up to instead, 1, 2, 4, …
  and the limit itself, where the chip's :class:`DeviceLimits` know it (``values`` where not);
- ``clamp_to``: the dim a tile knob tiles, or ``None`` (the candidates, whatever the shape);
- ``clamp``: how the dim ``d`` caps the candidates, each value becoming ``min(value, cap)``
  (deduplicated, sorted), so "the whole dim" is always a candidate:

  - ``"min"``: ``cap = d`` (the portable and native kernels' tiles);
  - ``"pow2_ceil"``: ``cap = max(pow2_ceil(d), min(values))``, the smallest power of two
    covering the dim but never below the smallest candidate (Triton's blocks, which
    ``tl.arange`` needs as powers of two).

One config stands beside the knobs' points: :data:`VENDOR_CONFIG`, the kernel's vendor
implementation (torch's own op, untiled), which has no knobs. It is a point of every space whose
kernel declares one (``KernelDeclaration.has_vendor``), measured and judged like the others.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

#: Bytes per element of each of the wire's dtype names (``tiletune.client.wire.DTYPES``).
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
#: The chip's limits a knob's values may be declared to run up to (``Knob.up_to``).
UP_TO_LIMITS = ("cores",)
#: How a tile knob's values are capped by its dim (see the module docstring).
CLAMP_MIN = "min"
CLAMP_POW2_CEIL = "pow2_ceil"
#: Every clamp rule, in the order they were introduced.
CLAMP_RULES = (CLAMP_MIN, CLAMP_POW2_CEIL)
#: The one entry of :data:`VENDOR_CONFIG`: a name no kernel may declare as a knob.
VENDOR_KNOB = "vendor"
#: The config of a kernel's vendor implementation (torch's own op): no knobs, the marker alone.
#: A plain ``{name: int}`` so that every reader of configs (the wire, the databases, older clients,
#: which refuse it as "not the kernel's knobs" and launch their default) takes it as it is.
VENDOR_CONFIG: Mapping[str, int] = MappingProxyType({VENDOR_KNOB: 1})


def is_vendor(config: object) -> bool:
    """Whether ``config`` is :data:`VENDOR_CONFIG` (never raises, whatever it is given)."""
    try:
        return isinstance(config, Mapping) and len(config) == 1 and config.get(VENDOR_KNOB) == 1
    except Exception:  # a mapping whose methods raise
        return False


def vendor_config() -> dict[str, int]:
    """A fresh copy of :data:`VENDOR_CONFIG`, for callers that keep or change configs."""
    return dict(VENDOR_CONFIG)


def pow2_ceil(value: int) -> int:
    """The smallest power of two >= ``value`` (1 for values below 2)."""
    return 1 if value < 2 else 1 << (value - 1).bit_length()


def pow2_up_to(count: int) -> tuple[int, ...]:
    """1, 2, 4, … up to ``count``, and ``count`` itself (``(1,)`` below 2)."""
    return tuple(sorted({1 << p for p in range(count.bit_length()) if 1 << p <= count} | {max(count, 1)}))


@dataclass(frozen=True)
class DeviceLimits:
    """What a chip allows a kernel's tiles, used by constraints and value rules before anything runs.

    ``local_memory_bytes`` is the fast memory one core's tiles must fit in: the
    unified buffer (UB) of an Ascend AI core, shared memory per block on a GPU,
    the L2 cache per core on a CPU. ``max_buffer_num`` is how many buffers a
    queue may rotate (Ascend C: 4 per position on training parts, 8 on A2).
    ``alignment_bytes`` is the granularity tiles are padded to in local memory.
    ``kind`` is the device kind (``cpu``, ``cuda``, ``npu``) for rules that differ
    by kind: e.g. Triton on Ascend has no warps and only single or double buffers.
    ``cores`` is how many cores the native kernels may spread a call over (a CPU worker's
    thread pool), ``None`` where not known (a worker that does not report it).
    """

    local_memory_bytes: int
    max_buffer_num: int = 4
    alignment_bytes: int = 32
    kind: str = "cpu"
    cores: int | None = None


@dataclass(frozen=True)
class Dim:
    """One named problem dim. ``choices`` set for categorical dims (e.g. causal: 0/1).

    ``default`` lets a shape leave the dim out (a dim added to a kernel after its first keys):
    an int is the value; a string names an earlier dim whose value it takes (``kv_heads``
    defaults to ``heads``). ``None``: the dim is required.
    """

    name: str
    doc: str
    choices: tuple[int, ...] | None = None
    default: int | str | None = None

    @property
    def categorical(self) -> bool:
        """True when the dim selects a variant rather than a size (never interpolated)."""
        return self.choices is not None


@dataclass(frozen=True)
class Knob:
    """One tuning knob and its declared value rule (see the module docstring).

    ``clamp_to`` names the dim a tile knob tiles; ``clamp`` is one of :data:`CLAMP_RULES`
    (``ValueError`` otherwise, when the knob is declared).
    """

    name: str
    values: tuple[int, ...]
    doc: str
    clamp_to: str | None = None
    clamp: str = CLAMP_MIN
    up_to: str | None = None

    def __post_init__(self) -> None:
        if self.name == VENDOR_KNOB:
            raise ValueError(f"knob {self.name}: the name is the vendor config's marker (VENDOR_KNOB)")
        if self.clamp not in CLAMP_RULES:
            raise ValueError(f"knob {self.name}: clamp {self.clamp!r} is not one of {list(CLAMP_RULES)}")
        if self.up_to is not None and self.up_to not in UP_TO_LIMITS:
            raise ValueError(f"knob {self.name}: up_to {self.up_to!r} is not one of {list(UP_TO_LIMITS)}")


def clamp_cap(values: Iterable[int], dim: int, rule: str) -> int:
    """The largest value a knob of ``values`` takes for a dim of ``dim`` under ``rule``."""
    return max(pow2_ceil(dim), min(values)) if rule == CLAMP_POW2_CEIL else dim


def clamped(values: Sequence[int], dim: int, rule: str) -> tuple[int, ...]:
    """``values`` capped by ``dim`` under ``rule`` (:func:`clamp_cap`), sorted and deduplicated."""
    cap = clamp_cap(values, dim, rule)
    return tuple(sorted({min(value, cap) for value in values}))


def candidates(knob: Knob, limits: DeviceLimits | None = None) -> tuple[int, ...]:
    """The knob's candidates on a chip of ``limits``: :func:`pow2_up_to` the limit it is declared
    ``up_to`` where ``limits`` knows it, else its declared ``values``."""
    limit = getattr(limits, knob.up_to) if knob.up_to is not None and limits is not None else None
    return knob.values if limit is None else pow2_up_to(limit)


def values_for(knob: Knob, shape: Mapping[str, int], limits: DeviceLimits | None = None) -> tuple[int, ...]:
    """The knob's values for ``shape`` on a chip of ``limits``: its :func:`candidates`, a tile
    knob's clamped by its dim. ``KeyError`` when ``shape`` lacks the dim the knob is clamped to."""
    values = candidates(knob, limits)
    if knob.clamp_to is None:
        return values
    return clamped(values, shape[knob.clamp_to], knob.clamp)


def knob_values(
    knobs: Sequence[Knob], shape: Mapping[str, int], limits: DeviceLimits | None = None
) -> dict[str, tuple[int, ...]]:
    """Each knob's values for ``shape`` on a chip of ``limits`` (:func:`values_for`), in
    declaration order."""
    return {knob.name: values_for(knob, shape, limits) for knob in knobs}


def snap_down(value: int, candidates: Sequence[int]) -> int:
    """The largest candidate <= value, or the smallest candidate if none is."""
    below = [c for c in candidates if c <= value]
    return max(below) if below else min(candidates)


def adapt(config: Mapping[str, int], values: Mapping[str, Sequence[int]]) -> dict[str, int] | None:
    """``config`` (of another shape) with each knob snapped down (:func:`snap_down`) to ``values``,
    the values the asked shape allows; ``None`` when its knobs are not those of ``values``."""
    if config.keys() != values.keys():
        return None
    return {name: snap_down(config[name], values[name]) for name in values}
