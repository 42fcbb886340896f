"""What a launch key (kernel, shape, dtype) must be before the client decides, asks or counts it.

A key the client takes is one the wire carries (:class:`~tiletune.client.wire.MissReport`'s
bounds): the kernel an identifier, the shape a mapping of at most 16 identifier dims to
integers in ``[0, MAX_DIM]`` (``bool`` refused: ``True`` is not a size), the dtype a
non-empty text of at most 16 characters. Anything else is a bad input: the client answers
it with the default and neither asks the server about it nor counts it as a miss.

:func:`key_problem` never raises, whatever it is given, and names the *kind* of the
problem without the offending values (the client logs each kind once).

Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from tiletune.client.wire import MAX_DIM

#: A kernel's, a dim's or a knob's name (the wire's ``Identifier``).
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
#: The most dims a shape has (the wire's ``Shape``).
MAX_DIMS = 16
#: The longest dtype name (the wire's ``MissReport.dtype``).
MAX_DTYPE_LENGTH = 16


def kind_of(value: object) -> str:
    """A short, bounded description of ``value``'s type (never its content): ``str``, ``NoneType``."""
    return type(value).__name__[:40]


def is_identifier(value: object) -> bool:
    """True when ``value`` is a ``str`` the wire takes as a name."""
    return isinstance(value, str) and IDENTIFIER.fullmatch(value) is not None


def key_problem(kernel: object, shape: object, dtype: object) -> str | None:
    """What is wrong with a launch key, as a kind (``shape is a list, not a mapping``), or ``None``."""
    try:
        return _problem(kernel, shape, dtype)
    except Exception as error:  # a mapping whose methods raise: still an answer
        return f"the key cannot be read ({kind_of(error)})"


def _problem(kernel: object, shape: object, dtype: object) -> str | None:
    if not isinstance(kernel, str):
        return f"kernel is a {kind_of(kernel)}, not a str"
    if not is_identifier(kernel):
        return "kernel is not a name (letters, digits, _; at most 64)"
    if not isinstance(dtype, str):
        return f"dtype is a {kind_of(dtype)}, not a str"
    if not 0 < len(dtype) <= MAX_DTYPE_LENGTH:
        return f"dtype is not 1 to {MAX_DTYPE_LENGTH} characters"
    if not isinstance(shape, Mapping):
        return f"shape is a {kind_of(shape)}, not a mapping"
    if len(shape) > MAX_DIMS:
        return f"shape has more than {MAX_DIMS} dims"
    for name, value in shape.items():
        if not is_identifier(name):
            return f"a dim name is a {kind_of(name)} that is not a name"
        if isinstance(value, bool) or not isinstance(value, int):
            return f"a dim is a {kind_of(value)}, not an int"
        if not 0 <= value <= MAX_DIM:
            return f"a dim is outside [0, {MAX_DIM}]"
    return None
