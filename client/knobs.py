"""A config checked against its kernel's knobs before the client serves it, and one adapted to a shape.

The rules (pure logic; no function here raises, whatever it is given):

- **structure**, always: a config is a mapping of at most 32 knob names (identifiers) to
  positive integers of at most ``MAX_DIM`` (``bool`` refused);
- **knob names**, with the kernel's :class:`~tiletune.client.wire.KernelInfo` of the
  entry's version: exactly ``info.knobs``, or the vendor config
  (:data:`~tiletune.client.space.VENDOR_CONFIG`: torch's own op, whose kernel the launcher
  checks has one);
- **values**, with its ``knob_values`` and a ``clamp_rule`` this client knows: each value is
  one of :func:`allowed_values` for the shape, exactly what ``KernelDeclaration.knob_values(shape)``
  gives on the server: a knob's candidates, a tile knob's (``clamp_to``) clamped by its dim
  ``d`` and deduplicated by the rule the kernel declares, evaluated by
  :func:`tiletune.client.space.knob_values` as the kernels themselves evaluate it (``min``:
  ``min(v, d)``; ``pow2_ceil``: ``min(v, max(pow2_ceil(d), min(values)))``). A rule this
  client does not know (a newer server's) checks the names and structure only.

:func:`adapt` snaps a nearest shape's config down to the values the asked shape allows,
as the server adapts its own nearest answers (both with :func:`tiletune.client.space.adapt`).

Standard library, the wire and :mod:`tiletune.client.space` only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tiletune.client import space
from tiletune.client.keys import is_identifier, kind_of
from tiletune.client.space import CLAMP_RULES, Knob, clamp_cap, knob_values
from tiletune.client.wire import MAX_DIM, KernelInfo

#: The most knobs a config has (the wire's ``Config``).
MAX_KNOBS = 32


def structure_problem(config: object) -> str | None:
    """What makes ``config`` no config at all (not a mapping of names to positive ints), or ``None``."""
    try:
        if not isinstance(config, Mapping):
            return f"the config is a {kind_of(config)}, not a mapping"
        if len(config) > MAX_KNOBS:
            return f"the config has more than {MAX_KNOBS} knobs"
        for name, value in config.items():
            if not is_identifier(name):
                return "a knob name is not a name"
            if isinstance(value, bool) or not isinstance(value, int):
                return f"{name} is a {kind_of(value)}, not an int"
            if not 0 < value <= MAX_DIM:
                return f"{name}={value} is not a positive int of at most {MAX_DIM}"
    except Exception as error:  # a mapping whose methods raise
        return f"the config cannot be read ({kind_of(error)})"
    return None


def allowed_values(info: KernelInfo, shape: Mapping[str, int]) -> dict[str, tuple[int, ...]] | None:
    """Each knob's values for ``shape`` as the kernel's spec gives them; ``None`` when unknown.

    Unknown: the info carries no values (an older server), a clamp rule this client does not
    know, or a knob clamped to a dim that ``shape`` lacks or holds no positive int in.
    """
    try:
        if info.knob_values is None or info.clamp_rule not in CLAMP_RULES:
            return None
        knobs: list[Knob] = []
        for name in info.knobs:
            candidates = info.knob_values.get(name)
            if not candidates:
                return None
            dim_name = info.clamp_to.get(name)
            dim = shape.get(dim_name) if dim_name is not None else 1
            if type(dim) is not int or dim <= 0:
                return None
            knobs.append(Knob(name, tuple(sorted(set(candidates))), "", dim_name, info.clamp_rule))
        return knob_values(knobs, shape)
    except Exception:  # a malformed info: nothing known
        return None


def config_problem(config: object, shape: Mapping[str, int], info: KernelInfo | None) -> str | None:
    """Why ``config`` may not be served for ``shape`` (see the module docstring), or ``None``.

    ``info`` is the kernel's info of the config's kernel version, ``None`` when unknown (then
    the structure alone is checked).
    """
    return KnobCheck(info).problem(config, shape)


class KnobCheck:
    """:func:`config_problem` for one kernel's info, compiled once (a bundle checks thousands)."""

    def __init__(self, info: KernelInfo | None) -> None:
        self.knobs: frozenset[str] | None = None
        #: knob -> (its values, the largest, the dim it is clamped to); empty when not known.
        self.values: dict[str, tuple[frozenset[int], int, str | None]] = {}
        self.rule = "min"
        if info is None:
            return
        try:
            self.knobs = frozenset(info.knobs) or None
            self.rule = info.clamp_rule
            if info.knob_values is None or info.clamp_rule not in CLAMP_RULES or self.knobs is None:
                return
            values = {}
            for knob in info.knobs:
                candidates = info.knob_values.get(knob)
                if not candidates:
                    return
                values[knob] = (frozenset(candidates), max(candidates), info.clamp_to.get(knob))
            self.values = values
        except Exception:  # a malformed info: names at most
            self.values = {}

    def problem(self, config: object, shape: Mapping[str, int]) -> str | None:
        """Why ``config`` may not be served for ``shape``, or ``None``; never raises."""
        try:
            return self._problem(config, shape)
        except Exception as error:  # a mapping whose methods raise
            return f"the config cannot be checked ({kind_of(error)})"

    def _problem(self, config: object, shape: Mapping[str, int]) -> str | None:
        if not isinstance(config, Mapping):
            return f"the config is a {kind_of(config)}, not a mapping"
        if space.is_vendor(config):
            return None
        if self.knobs is None:
            return structure_problem(config)
        if config.keys() != self.knobs:
            return f"its knobs {sorted(map(str, config))} are not the kernel's {sorted(self.knobs)}"
        for name, value in config.items():
            if type(value) is not int or not 0 < value <= MAX_DIM:
                return f"{name}={value!r} is not a positive int of at most {MAX_DIM}"
            known = self.values.get(name)
            if known is not None and not self._allowed(value, known, shape):
                return f"{name}={value} is outside the kernel's values for this shape"
        return None

    def _allowed(
        self, value: int, known: tuple[frozenset[int], int, str | None], shape: Mapping[str, int]
    ) -> bool:
        """Whether ``value`` is one of :func:`~tiletune.client.space.clamped` (the candidates under
        the dim), without building it."""
        candidates, largest, dim_name = known
        if dim_name is None:
            return value in candidates
        dim = shape.get(dim_name)
        if type(dim) is not int or dim <= 0:
            return False
        cap = clamp_cap(candidates, dim, self.rule)
        return (value in candidates and value <= cap) or (value == cap and largest >= cap)


def values_problem(config: Mapping[str, int], values: Mapping[str, Sequence[int]]) -> str | None:
    """Why ``config`` is not among ``values`` (each knob's values for the shape), or ``None``; the
    vendor config is among every kernel's."""
    try:
        if space.is_vendor(config):
            return None
        if set(config) != set(values):
            return f"its knobs {sorted(config)} are not the kernel's {sorted(values)}"
        for name, value in config.items():
            if value not in values[name]:
                return f"{name}={value} is outside the kernel's values for this shape"
    except Exception as error:
        return f"the config cannot be checked ({kind_of(error)})"
    return None


def adapt(
    config: Mapping[str, int], shape: Mapping[str, int], info: KernelInfo | None
) -> dict[str, int] | None:
    """``config`` (of another shape) with each knob snapped down to the values ``shape`` allows.

    The largest allowed value at most the config's, else the smallest allowed. Without
    the kernel's values the config is returned as it is; ``None`` when it has other knobs.
    """
    if info is None:
        return dict(config)
    allowed = allowed_values(info, shape)
    if allowed is None:
        return dict(config) if not info.knobs or set(config) == set(info.knobs) else None
    return space.adapt(config, allowed)
