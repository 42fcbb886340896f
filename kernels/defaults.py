"""What the installed kernels hand a runtime client: their default rule and their versions.

The client library (:mod:`tiletune.client`) never imports the kernels: a process that has
them passes these callables in :class:`~tiletune.client.core.ClientSettings`, most simply
as ``ConfigClient(url, settings=client_settings())``. Then a key nobody tuned gets the
kernel's hand-written rule for the chip (not ``{}``), and entries tuned with another
version of a kernel than the installed one are never used.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tiletune.client.core import ClientSettings
from tiletune.kernels.declaration import Config
from tiletune.kernels.device import get_device
from tiletune.kernels.errors import InputError
from tiletune.kernels.registry import get_kernel


def default_rule(kernel: str, shape: Mapping[str, int], dtype: str, chip: str) -> Config:
    """The default config of ``kernel`` at ``shape`` and ``dtype`` on the device kind of ``chip``.

    Raises :class:`~tiletune.kernels.errors.InputError` for an unknown kernel, shape or device.
    """
    spec = get_kernel(kernel)
    parsed = spec.parse_shape(dict(shape))
    limits = get_device(chip.split("/", 1)[0]).chip.limits
    return dict(spec.default_config(parsed, dtype, limits))


def installed_version(kernel: str) -> int | None:
    """The version of ``kernel`` installed here, ``None`` when it is not installed."""
    try:
        return get_kernel(kernel).version
    except InputError:
        return None


def client_settings(**overrides: Any) -> ClientSettings:
    """:class:`ClientSettings` (``overrides`` over the defaults) with the installed kernels' rules."""
    return ClientSettings(**{"default_rule": default_rule, "kernel_version": installed_version, **overrides})
