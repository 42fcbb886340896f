"""The on-disk cache of best configs: one bundle file per chip, shared by the processes of a node.

Contract:

- ``load()`` never raises: a missing file is empty, a corrupt or foreign one
  is logged and read as empty (it is replaced by the next ``save``); of a file
  that parses but holds entries that do not, the readable entries are kept (the
  others are logged and dropped by the next ``save``). Configs are checked
  against their kernels' knobs when the client takes them
  (:class:`~tiletune.client.known.KnownConfigs`), not here;
- ``save(bundle)`` merges ``bundle`` into what the file holds now (newer
  promotions win per key) and replaces the file atomically (a temporary file
  in the same folder, then ``os.replace``), under an advisory lock
  (``fcntl.flock`` on a lock file beside it) so that processes saving at once
  lose none of each other's entries and readers never see a partial file;
- ``save`` never raises: it returns ``False`` (logged) when the folder is not
  writable or the bundle cannot be written: a read-only node still runs.

Bundles exported for air-gapped clusters are the same format
(:class:`~tiletune.client.wire.ConfigBundle` as JSON).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

from pydantic import ValidationError

from tiletune.client.known import KnownConfigs
from tiletune.client.wire import BestConfigPublic, ConfigBundle

log = logging.getLogger(__name__)

#: Where nodes keep their caches unless told otherwise (``$TILETUNE_CACHE_DIR`` wins).
CACHE_DIR_ENV = "TILETUNE_CACHE_DIR"


def default_cache_dir() -> Path:
    """``$TILETUNE_CACHE_DIR``, else ``$XDG_CACHE_HOME/tiletune``, else ``~/.cache/tiletune``."""
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tiletune"


def read_bundle(path: Path) -> ConfigBundle:
    """A bundle file; raises ``OSError`` or ``ValueError`` (for the import command to report)."""
    return ConfigBundle.model_validate_json(path.read_bytes())


def write_bundle(path: Path, bundle: ConfigBundle) -> None:
    """Write a bundle atomically (temporary file, then rename); raises ``OSError``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(bundle.model_dump_json(indent=1).encode())
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


class DiskCache:
    """The bundle file of one chip under ``folder``; see the module docstring."""

    def __init__(self, folder: Path, chip: str) -> None:
        self.chip = chip
        self.path = folder / f"{_file_name(chip)}.json"
        self._lock_path = folder / f".{_file_name(chip)}.lock"

    def load(self) -> ConfigBundle:
        """What the file holds (empty when missing or unreadable); never raises."""
        return self._read(quiet=False)

    def save(self, bundle: ConfigBundle) -> bool:
        """Merge ``bundle`` into the file; ``False`` (logged) when it cannot be written."""
        try:
            with self._locked():
                merged = KnownConfigs(self.chip)
                merged.add_bundle(self._read(quiet=True))
                merged.add_bundle(bundle)
                write_bundle(self.path, merged.bundle())
        except (OSError, ValueError) as error:  # a read-only folder, a full disk, an unwritable value
            log.warning("cannot write the config cache %s: %s", self.path, error)
            return False
        return True

    def _read(self, quiet: bool) -> ConfigBundle:
        empty = ConfigBundle(chip=self.chip, configs=[])
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return empty
        except Exception as error:  # a folder in its place, no permission, ...
            self._unreadable(quiet, error)
            return empty
        try:
            return ConfigBundle.model_validate_json(raw)
        except Exception as error:  # one bad entry: keep the others
            salvaged = _salvage(raw)
            if salvaged is None:
                self._unreadable(quiet, error)
                return empty
            bundle, dropped = salvaged
            if not quiet:
                log.warning("ignoring %d unreadable entries of the config cache %s", dropped, self.path)
            return bundle

    def _unreadable(self, quiet: bool, error: Exception) -> None:
        if not quiet:
            log.warning("ignoring the unreadable config cache %s (%s)", self.path, type(error).__name__)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self._lock_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self._lock_path, "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def _salvage(raw: bytes) -> tuple[ConfigBundle, int] | None:
    """The readable entries of a bundle file whose other entries do not parse, and how many
    were dropped; ``None`` when the file is no bundle at all."""
    try:
        document = json.loads(raw)
        if not isinstance(document, dict) or not isinstance(document.get("configs"), list):
            return None
        entries = document["configs"]
        try:
            bundle = ConfigBundle.model_validate({**document, "configs": []})
        except ValidationError:
            bundle = ConfigBundle.model_validate({**document, "configs": [], "kernels": []})
        kept = []
        for entry in entries:
            try:
                kept.append(BestConfigPublic.model_validate(entry))
            except ValidationError:
                continue
        return bundle.model_copy(update={"configs": kept}), len(entries) - len(kept)
    except Exception:  # not JSON, too deep, not a bundle
        return None


def _file_name(chip: str) -> str:
    """A chip name as a file name: ``cpu/Intel Xeon (AVX-512)/2c`` -> ``cpu_Intel_Xeon_AVX-512_2c``."""
    return re.sub(r"[^A-Za-z0-9.-]+", "_", chip).strip("_") or "chip"
