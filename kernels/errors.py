"""Errors for bad input: each names the field at fault and the reason.

They derive from ``ValueError`` so callers that only want "bad input" can catch
that; the CLI prints ``str(error)`` and exits non-zero, the service (later)
maps them to 4xx responses with ``field`` and ``message``.
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad input from a user: ``field`` says where, ``reason`` says why."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class UnknownKernelError(InputError):
    """No kernel of that name is registered (built in or by a plugin)."""

    def __init__(self, name: str, known: list[str]) -> None:
        super().__init__("kernel", f"unknown kernel {name!r}; known: {', '.join(sorted(known))}")


class ShapeError(InputError):
    """A shape is missing a dim, has an extra one, or has a bad value."""


class ConfigError(InputError):
    """A config names an unknown knob, lacks one, or uses a value outside the space."""


class DTypeError(InputError):
    """A dtype name is not one of the supported ones."""


class DeviceUnavailableError(RuntimeError):
    """The requested device (cuda, npu) is not present or its runtime is not installed."""


class DeviceError(RuntimeError):
    """A kernel run failed on the device in a way that may leave its context unusable (an illegal
    memory access, an AI core exception). A kernel raises it to say so; an isolated worker then fails
    the config with this error and measures the next ones in a fresh process."""
