"""The answer a launch gets: :class:`Tiling`, made from a tuned entry or as the kernel's default.

An answer from an entry (:func:`tiling_of`) carries the entry's provenance and is marked
``stale`` when the entry was tuned with other software than this process runs
(:func:`stale_reason`); a default answer (:func:`default_tiling`) carries neither. Which
answer a key gets is decided in :mod:`tiletune.client.core`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from tiletune.client.keys import kind_of
from tiletune.client.wire import BestConfigPublic, Match

#: A software fingerprint: package (torch, triton, python, ...) -> version (``None``: not installed).
Software = Mapping[str, "str | None"]


@dataclass(frozen=True, slots=True)
class Tiling:
    """The config to launch with and how it was found.

    ``match``: ``exact`` (tuned for this key), ``nearest`` (tuned for the
    nearest shape), ``default`` (the kernel's built-in rule). ``best`` is the
    tuned entry's provenance (job, trial, software, times); ``stale`` says why
    the entry's software differs from this process's, if it does; ``source``:
    ``server``, ``memory`` (known from a prefetch or an import), ``disk`` or
    ``default``.
    """

    kernel: str
    config: Mapping[str, int]
    match: Match
    source: str
    best: BestConfigPublic | None = None
    stale: str | None = None


def tiling_of(
    entry: BestConfigPublic,
    match: Match,
    source: str,
    software: Software,
    config: Mapping[str, int] | None = None,
) -> Tiling:
    """An answer from ``entry`` (with ``config`` instead of the entry's when given: an adapted one),
    marked stale when the entry's software differs from ``software``, this process's."""
    chosen = dict(config if config is not None else entry.config)
    return Tiling(entry.kernel, MappingProxyType(chosen), match, source, entry, stale_reason(entry, software))


def stale_reason(entry: BestConfigPublic, software: Software) -> str | None:
    """Why ``entry`` is stale here: each package whose version differs from ``software``'s (``None``:
    the same software, or an entry that records none)."""
    if not entry.software:
        return None
    differences = [
        f"{name} {entry.software.get(name)} (here {software.get(name)})"
        for name in sorted(set(entry.software) | set(software))
        if entry.software.get(name) != software.get(name)
    ]
    return "tuned with " + ", ".join(differences) if differences else None


def default_tiling(kernel: object, config: Mapping[str, int]) -> Tiling:
    """The default answer ``config`` for ``kernel`` (a launch's kernel, whatever its type)."""
    return Tiling(kernel_name(kernel), MappingProxyType(dict(config)), "default", "default")


def kernel_name(kernel: object) -> str:
    """The kernel of an answer: its name, or ``<type>`` for a kernel that is not a ``str``."""
    return kernel if isinstance(kernel, str) else f"<{kind_of(kernel)}>"
