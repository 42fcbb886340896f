"""Replay kernels: recorded tuning spaces as kernels the service tunes, measured by lookup.

One :class:`ReplayDeclaration` per recorded space (:mod:`tiletune.kernels.replay.recorded`), named
``replay_<space>`` (``replay_pnpoly_RTX_3090``), version :data:`REPLAY_KERNEL_VERSION`.
They exist so the service can be driven at fleet scale in tests and benchmarks: a worker with
``--backend replay`` (:class:`~tiletune.kernels.device.ReplayDevice`) "measures" a config by
looking its time up, in microseconds, with no torch tensor and no timing loop.

Opt-in: :func:`registered_replay_kernels` returns them only when ``$TILETUNE_REPLAY_KERNELS``
names a directory of recorded spaces (``*.json.gz``), and the registry adds exactly those;
production servers and ``tiletune kernels`` never see them otherwise. It is its own variable,
not the search benchmark's ``$TILETUNE_REPLAY_DIR``, so pointing the benchmark (or the test
suite) at recordings never adds kernels to a server. A server and its replay workers must be
given the same directory.

What a spec means:

- dims: ``variant`` (a positive integer) and nothing else, so one recording makes as many
  distinct keys (jobs) as a sweep names variants;
- knobs: the recording's tune params and their values, in its order (single-valued knobs
  included): the server's search runs over exactly the recorded knob product;
- ``invalid_reason``: not in the recorded cache (Kernel Tuner's constraints rejected it: the
  recorded invalid region). The base rules (``buffer_num`` / ``pipeline_depth`` / working set
  against local memory) are not applied: the recorded knobs are a GPU kernel's own, none of
  them is a buffer count or pipeline depth, and the recording already holds what the chip
  allowed. dtype and the chip's limits do not enter;
- times: variant 1 is the recording exactly; variant ``v > 1`` scales each config's recorded
  time by a factor in ``[1 - VARIANT_SPREAD, 1 + VARIANT_SPREAD]`` drawn from a hash of
  ``(v, config)`` (:func:`variant_factor`; deterministic, the same in every process), so the
  variants' optima differ and a result told to the wrong job shows. A recorded failure
  (``RuntimeFailedConfig``, ...) fails in every variant;
- ``default_config``: the config of median recorded time in the recording (variant 1's
  times, so the same config for every variant; the one :func:`~tiletune.tuner.measure.tune.tune_replay`
  takes): deterministic, valid, measured, and a mediocre stand-in for a hand-written rule, so
  the search's seed hands it no knowledge of the optimum (Kernel Tuner records no default);
- ``make_inputs``, ``reference``, ``run`` (its spec, :mod:`tiletune.kernels.replay.spec`): there
  is nothing to run; each raises ``NotRunnableError``. ``backends()`` is ``("replay",)``,
  ``supports(kind)`` is true for the ``replay`` device kind alone; ``flops`` and ``bytes_moved``
  are 0, and no tensor is declared (``tensor_bytes`` and ``workspace_bytes`` are empty:
  ``allocated_bytes`` is 0).

Loading is lazy: a spec knows its name and file from the directory listing, and parses the
recording on first use of its knobs, validity or times (once per process; then cached).

Torch-free: imports the standard library, :mod:`tiletune.kernels.declaration` and
:mod:`tiletune.kernels.replay.recorded` (never the tuner); the spec's torch half is
:mod:`tiletune.kernels.replay.spec`.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tiletune.client.space import DeviceLimits, Dim, Knob
from tiletune.kernels.declaration import Config, KernelDeclaration, Shape
from tiletune.kernels.replay.recorded import (
    Key,
    RecordedOutcome,
    RecordedSpace,
    ReplayError,
    load_recorded,
    replay_spaces,
)

#: Environment variable naming the directory whose recorded spaces become replay kernels.
REPLAY_KERNELS_ENV = "TILETUNE_REPLAY_KERNELS"

#: The device kind replay kernels run on, and their one implementation.
REPLAY_KIND = "replay"

#: Prefix of a replay kernel's name; the rest is the recorded space's (file) name.
REPLAY_PREFIX = "replay_"

#: Every replay kernel's version: bump it when the meaning of times or variants changes.
REPLAY_KERNEL_VERSION = 1

#: Half-width of the band variant ``v > 1`` scales recorded times by (0.1: within ±10 %).
VARIANT_SPREAD = 0.1

#: The one dim: which copy of the recording a key is (1 = the recording's own times).
VARIANT = Dim("variant", "which copy of the recording (1: recorded times; others: perturbed)")

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: The wire's identifiers are at most 64 characters.
_MAX_NAME = 64


def variant_factor(variant: int, key: Key) -> float:
    """How variant ``variant`` scales the recorded time of the config with entry ``key``.

    1.0 for variant 1; otherwise a value in ``[1 - VARIANT_SPREAD, 1 + VARIANT_SPREAD]``
    from a BLAKE2b hash of ``(variant, key)``: the same in every process and Python version.
    """
    if variant == 1:
        return 1.0
    digest = hashlib.blake2b(repr((variant, key)).encode(), digest_size=8).digest()
    unit = int.from_bytes(digest, "big") / 2.0**64
    return 1.0 + VARIANT_SPREAD * (2.0 * unit - 1.0)


class ReplayDeclaration(KernelDeclaration):
    """One recorded space as a kernel's declaration (see the module docstring for what it means)."""

    implementations: tuple[str, ...] = (REPLAY_KIND,)
    version = REPLAY_KERNEL_VERSION
    dims = (VARIANT,)

    def __init__(self, space_name: str, path: Path) -> None:
        self.space_name = space_name
        self.path = path
        self.name = f"{REPLAY_PREFIX}{space_name}"
        self.description = f"recorded space {space_name} (Kernel Tuner cache), measured by lookup"
        self._recording: RecordedSpace | None = None
        self._knobs: tuple[Knob, ...] | None = None
        self._lock = threading.Lock()

    # -- the recording, loaded on first use ---------------------------------------------------

    @property
    def recording(self) -> RecordedSpace:
        """The recorded space, parsed on first use; :class:`ReplayError` naming the file if it cannot be."""
        recording = self._recording
        if recording is None:
            with self._lock:
                if self._recording is None:
                    self._recording = load_recorded(self.path, RecordedSpace)
                recording = self._recording
        return recording

    @property
    def knobs(self) -> tuple[Knob, ...]:  # type: ignore[override]  # read-only: the recording's
        """The recording's tune params and their values, in its order."""
        knobs = self._knobs
        if knobs is None:
            knobs = tuple(
                Knob(name, values, f"recorded tune param {name}")
                for name, values in self.recording.knobs.items()
            )
            self._knobs = knobs
        return knobs

    # -- the spec's contract -------------------------------------------------------------------

    def invalid_reason(self, config: Config, shape: Shape, dtype: str, limits: DeviceLimits) -> str | None:
        """Why ``config`` is never measured (not in the recorded cache), or ``None``."""
        return self.recording.invalid_reason(config)

    def default_config(self, shape: Shape, dtype: str, limits: DeviceLimits) -> Config:
        """The recording's config of median recorded time (the same for every variant)."""
        return self.recording.median_config()

    def working_set_bytes(self, config: Config, shape: Shape, dtype: str) -> int:
        """Nothing is held: 0."""
        return 0

    def recorded(self, config: Config, shape: Shape) -> RecordedOutcome:
        """The "measurement" of a valid ``config`` at ``shape``'s variant: a time in ms, or the failure.

        Raises ``ValueError`` for a config outside the recorded region.
        """
        outcome = self.lookup(config, shape)
        if outcome is None:
            raise ValueError(f"config {config}: {self.recording.invalid_reason(config)}")
        return outcome

    def lookup(self, config: Config, shape: Shape) -> RecordedOutcome | None:
        """:meth:`recorded`, or ``None`` for a config outside the recorded region: one dict lookup."""
        recording = self.recording
        try:
            key = recording.key(config)
        except KeyError:
            return None
        time = recording.entries.get(key)
        if time is None:
            return None
        if isinstance(time, str):
            return RecordedOutcome(time_ms=None, error=time)
        variant = shape[VARIANT.name]
        factor = 1.0 if variant == 1 else variant_factor(variant, key)
        return RecordedOutcome(time_ms=time * factor, error=None)

    def flops(self, shape: Shape) -> float:
        """Unknown to the recording: 0."""
        return 0.0

    def bytes_moved(self, shape: Shape, dtype: str) -> float:
        """Unknown to the recording: 0."""
        return 0.0

    def tensor_bytes(self, shape: Shape, dtype: str) -> dict[str, int]:
        """A recorded space has no tensors: none."""
        return {}

    def workspace_bytes(self, shape: Shape, dtype: str) -> dict[str, int]:
        """Nothing is allocated to "measure" a replay kernel: none."""
        return {}


def replay_space_names(directory: Path | str) -> dict[str, tuple[str, Path]]:
    """Each recorded space in ``directory`` by its kernel name: its space name and file, sorted.

    A file whose name does not make a kernel name (letters, digits, ``_``; at most 64
    characters with the prefix) is skipped with a warning. Raises :class:`ReplayError`
    naming the directory when it is not one.
    """
    names: dict[str, tuple[str, Path]] = {}
    for space_name, path in replay_spaces(directory).items():
        name = f"{REPLAY_PREFIX}{space_name}"
        if not _NAME.match(name) or len(name) > _MAX_NAME:
            warnings.warn(f"skipping recorded space {path}: {name!r} is not a kernel name", stacklevel=2)
            continue
        names[name] = (space_name, path)
    return names


def registered_replay_directory(environ: Mapping[str, str] = os.environ) -> dict[str, tuple[str, Path]]:
    """The recorded spaces of ``$TILETUNE_REPLAY_KERNELS``'s directory (:func:`replay_space_names`);
    none when it is unset or empty.

    A directory that does not exist is a warning and no kernels (the built-ins are never
    broken by it).
    """
    directory = environ.get(REPLAY_KERNELS_ENV, "").strip()
    if not directory:
        return {}
    try:
        return replay_space_names(directory)
    except ReplayError as error:
        warnings.warn(f"no replay kernels from ${REPLAY_KERNELS_ENV}: {error}", stacklevel=2)
        return {}


def registered_replay_declarations(environ: Mapping[str, str] = os.environ) -> dict[str, ReplayDeclaration]:
    """A declaration per recorded space of ``$TILETUNE_REPLAY_KERNELS`` (none when it is unset)."""
    return {
        name: ReplayDeclaration(space_name, path)
        for name, (space_name, path) in registered_replay_directory(environ).items()
    }


def variant_sweep(
    kernel: str, variants: int, *, trials: int, chip: str | None = None, **fields: Any
) -> dict[str, Any]:
    """A sweep (``SweepCreate`` form) of ``kernel`` at variants ``1..variants``: one job each.

    ``chip`` targets one chip (the replay workers' ``replay/recorded``); ``fields`` are
    further ``SweepCreate`` fields (``seed``, ``force``, ``name``, ...). A sweep holds at
    most 1,000 shapes. Print it as JSON for ``tiletune submit FILE`` (or ``-``: stdin).
    """
    if variants < 1:
        raise ValueError(f"variants must be at least 1, got {variants}")
    sweep: dict[str, Any] = {
        "kernel": kernel,
        "shapes": [{VARIANT.name: variant} for variant in range(1, variants + 1)],
        "trials": trials,
        **fields,
    }
    if chip is not None:
        sweep["chips"] = [chip]
    return sweep
