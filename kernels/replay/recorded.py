"""Recorded tuning spaces: a kernel's brute-force measurements, read once and looked up.

A recorded space is a brute-force measurement of a real kernel over its whole
tuning space, in Kernel Tuner's cache format (gzipped JSON; see
``../shared/replay/README.md``): ``device_name``, ``kernel_name``,
``tune_params`` (knob -> values, in order), ``tune_params_keys`` and
``cache`` (one entry per config with its knob values and ``time`` in ms).

How the file maps onto tiletune's search:

- every knob value is an int, and a config is a ``dict[str, int]`` over all
  knobs in ``tune_params_keys`` order (single-valued knobs included);
- configs of the knob product that are *absent* from ``cache`` are the invalid
  region: Kernel Tuner's constraints rejected them, so ``invalid_reason``
  rejects them and they are never measured;
- a cache entry whose ``time`` is a string (``RuntimeFailedConfig``,
  ``CompilationFailedConfig``) is a measured failure: the config passed the
  constraints, ran, and failed; ``measure`` reports it as an error;
- the *valid space* (``valid_count``) is every config in ``cache``, failures
  included (on hardware a failing config costs a measurement too), and the
  optimum is the fastest numeric time.

Two users: the search benchmark's replay device (:mod:`tiletune.tuner.measure.replay` adds the
search space to :class:`RecordedSpace`) and the replay kernels the service tunes
(:mod:`tiletune.kernels.replay.spec`). Imports only the standard library: it lives in
``tiletune.kernels`` because the kernels may never import the tuner.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import statistics
import threading
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

#: A config of a recorded space: every knob (in ``tune_params_keys`` order) to its value.
Config = dict[str, int]

#: Environment variable naming the directory of recorded spaces.
REPLAY_DIR_ENV = "TILETUNE_REPLAY_DIR"

#: File name suffix of a recorded space; the name of the space is the rest.
REPLAY_SUFFIX = ".json.gz"

#: The reason ``invalid_reason`` gives for a config outside the recorded (valid) region.
NOT_RECORDED = "not in the recorded space (rejected by the kernel's constraints)"

Key = tuple[int, ...]

SpaceT = TypeVar("SpaceT", bound="RecordedSpace")


class ReplayError(ValueError):
    """A recorded space is missing or unreadable; the message names the path."""


class RecordedFailureError(RuntimeError):
    """The recorded measurement of a config failed (e.g. ``RuntimeFailedConfig``)."""


@dataclass(frozen=True)
class RecordedOutcome:
    """What the replay device reports for one config: a time or an error, never both."""

    time_ms: float | None
    error: str | None


@dataclass(frozen=True, eq=False)
class RecordedSpace:
    """One recorded tuning space, immutable once loaded.

    ``knobs`` maps each knob to its ordered candidate values; ``entries`` maps
    the tuple of a config's values (in knob order) to its recorded time in ms
    or, for a measured failure, the failure's name.
    """

    name: str
    path: Path
    device_name: str
    kernel_name: str
    knobs: Mapping[str, tuple[int, ...]]
    entries: Mapping[Key, float | str] = field(repr=False)

    @property
    def product_size(self) -> int:
        """How many configs the knob product holds (valid and invalid)."""
        return math.prod(len(values) for values in self.knobs.values())

    @property
    def valid_count(self) -> int:
        """How many configs pass the constraints (all recorded ones, failures included)."""
        return len(self.entries)

    @property
    def failed_count(self) -> int:
        """How many valid configs failed when they were measured."""
        return sum(isinstance(time, str) for time in self.entries.values())

    @property
    def optimum_ms(self) -> float:
        """The fastest recorded time."""
        return self._optimum[1]

    @property
    def optimum_config(self) -> Config:
        """A config with the fastest recorded time."""
        return self._config(self._optimum[0])

    @property
    def _optimum(self) -> tuple[Key, float]:
        return _optimum_of(self)

    def key(self, config: Mapping[str, int]) -> Key:
        """The entry key of a config; raises ``KeyError`` naming a missing knob."""
        return tuple(config[name] for name in self.knobs)

    def invalid_reason(self, config: Config) -> str | None:
        """Why a config is never measured (outside the recorded region), or ``None``."""
        try:
            key = self.key(config)
        except KeyError as missing:
            return f"config lacks knob {missing.args[0]!r}"
        return None if key in self.entries else NOT_RECORDED

    def measure(self, config: Config) -> RecordedOutcome:
        """The recorded outcome of a valid config; raises ``ValueError`` for an invalid one."""
        reason = self.invalid_reason(config)
        if reason is not None:
            raise ValueError(f"config {config}: {reason}")
        time = self.entries[self.key(config)]
        if isinstance(time, str):
            return RecordedOutcome(time_ms=None, error=time)
        return RecordedOutcome(time_ms=time, error=None)

    def time_ms(self, config: Config) -> float:
        """The recorded time of a valid config; raises :class:`RecordedFailureError` for a failed one."""
        outcome = self.measure(config)
        if outcome.time_ms is None:
            raise RecordedFailureError(f"config {config}: {outcome.error}")
        return outcome.time_ms

    def median_config(self) -> Config:
        """A valid config of median recorded time: a stand-in for a typical hand-written default."""
        return self._config(_median_of(self))

    def _config(self, key: Key) -> Config:
        return dict(zip(self.knobs, key, strict=True))


@lru_cache(maxsize=16)
def _optimum_of(space: RecordedSpace) -> tuple[Key, float]:
    numeric = [(time, key) for key, time in space.entries.items() if not isinstance(time, str)]
    if not numeric:
        raise ReplayError(f"{space.path}: no successful measurement recorded")
    time, key = min(numeric)
    return key, time


@lru_cache(maxsize=16)
def _median_of(space: RecordedSpace) -> Key:
    numeric = sorted((time, key) for key, time in space.entries.items() if not isinstance(time, str))
    if not numeric:
        raise ReplayError(f"{space.path}: no successful measurement recorded")
    median = statistics.median_low(time for time, _ in numeric)
    return next(key for time, key in numeric if time == median)


def default_replay_dir() -> Path | None:
    """Where recorded spaces live: ``$TILETUNE_REPLAY_DIR``, else ``../shared/replay``.

    ``../shared/replay`` is looked for relative to the current directory, then
    relative to the repository root (two levels above this file's package
    folder). Returns ``None`` when none of them is a directory.
    """
    configured = os.environ.get(REPLAY_DIR_ENV)
    if configured:
        return Path(configured)
    repo_root = Path(__file__).resolve().parent.parent
    for candidate in (Path.cwd() / ".." / "shared" / "replay", repo_root / ".." / "shared" / "replay"):
        if candidate.is_dir():
            return candidate.resolve()
    return None


def replay_spaces(path: Path | str | None = None) -> dict[str, Path]:
    """The recorded spaces in a directory, name -> file, sorted by name.

    ``path`` defaults to :func:`default_replay_dir`; raises :class:`ReplayError`
    naming the path when it is not a directory (or no default exists).
    """
    directory = Path(path) if path is not None else default_replay_dir()
    if directory is None:
        raise ReplayError(f"no replay directory: set ${REPLAY_DIR_ENV} or create ../shared/replay")
    if not directory.is_dir():
        raise ReplayError(f"{directory}: not a directory of recorded spaces")
    files = sorted(directory.glob(f"*{REPLAY_SUFFIX}"))
    return {file.name.removesuffix(REPLAY_SUFFIX): file for file in files}


def load_recorded(path: Path | str, kind: type[SpaceT]) -> SpaceT:
    """Load a recorded space (Kernel Tuner cache, gzipped JSON) as a ``kind`` (:class:`RecordedSpace`
    or a subclass); parsed once per process and kind (a file rewritten since is parsed again).

    Raises :class:`ReplayError` naming the path when the file is missing,
    not gzip, not JSON, or not in the expected format.
    """
    file = Path(path).resolve()
    try:
        stat = file.stat()
    except OSError as error:
        raise ReplayError(f"{file}: cannot read recorded space ({error.strerror})") from None
    stamp = (stat.st_mtime_ns, stat.st_size)
    with _LOADED_LOCK:
        found = _LOADED.get((file, kind))
        if found is None or found[0] != stamp:
            found = (stamp, _load(file, kind))
            _LOADED[(file, kind)] = found
    space = found[1]
    assert isinstance(space, kind)
    return space


#: Spaces loaded in this process, by file and kind: the file's (mtime, size) when read, the space.
_LOADED: dict[tuple[Path, type[RecordedSpace]], tuple[tuple[int, int], RecordedSpace]] = {}
_LOADED_LOCK = threading.Lock()


def _load(file: Path, kind: type[RecordedSpace]) -> RecordedSpace:
    document = _read_json(file)
    try:
        return _parse(file, document, kind)
    except (KeyError, TypeError, ValueError) as error:
        raise ReplayError(f"{file}: not a Kernel Tuner cache ({type(error).__name__}: {error})") from None


def _read_json(file: Path) -> Any:
    try:
        with gzip.open(file, "rt", encoding="utf-8") as stream:
            return json.load(stream)
    except OSError as error:
        raise ReplayError(f"{file}: cannot read recorded space ({error})") from None
    except (EOFError, zlib.error, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ReplayError(f"{file}: corrupt recorded space ({error})") from None


def _parse(file: Path, document: Any, kind: type[RecordedSpace]) -> RecordedSpace:
    if not isinstance(document, dict):
        raise TypeError("top level is not an object")
    names = [str(name) for name in document["tune_params_keys"]]
    knobs = {name: _knob_values(name, document["tune_params"][name]) for name in names}
    entries: dict[Key, float | str] = {}
    for entry in document["cache"].values():
        key = tuple(_int(name, entry[name]) for name in names)
        for name, value in zip(names, key, strict=True):
            if value not in knobs[name]:
                raise ValueError(f"entry value {name}={value} is not among the knob's values")
        entries[key] = _time(entry["time"])
    return kind(
        name=file.name.removesuffix(REPLAY_SUFFIX),
        path=file,
        device_name=str(document["device_name"]),
        kernel_name=str(document["kernel_name"]),
        knobs=MappingProxyType(knobs),
        entries=MappingProxyType(entries),
    )


def _knob_values(name: str, values: Any) -> tuple[int, ...]:
    if not isinstance(values, list) or not values:
        raise TypeError(f"knob {name!r} has no list of values")
    return tuple(_int(name, value) for value in values)


def _int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"knob {name!r} has a non-integer value {value!r}")
    return value


def _time(value: Any) -> float | str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TypeError(f"time {value!r} is neither a number of ms nor a failure name")
    return float(value)
