"""The bulk export (``GET /v1/configs?chip=``) as cached bodies: built once per change, revalidated by ETag.

:class:`Exports` keeps, per (chip, kernel), the serialised ``ConfigBundle`` and its gzip, built
from the in-memory index (:mod:`tiletune.service.index`) in the thread pool, once per change of
the chip's entries however many requests arrive at once
(:class:`~tiletune.service.singleflight.SingleFlight`).

- The body is the bundle as ``ConfigBundle.model_dump_json`` writes it, the entries spliced in
  as each entry serialised itself once; entries in (kernel, shape key, dtype, version) order;
  ``checksum`` as :meth:`ConfigBundle.sealed` computes it.
- ``tag`` is the SHA-256 of what the bundle says (chip, kernels' info, checksum of the entries):
  it changes exactly when the bundle changes. A rebuild with the same tag keeps the previous
  body, so **``exported_at`` is when the bundle last changed content as this replica built it**
  (not the time of the request).
- The strong ``ETag`` is ``"<tag>"`` for the identity body, ``"<tag>-gzip"`` for the gzip one
  (one per representation); ``If-None-Match`` naming either (or ``*``) is answered
  ``304 Not Modified`` with no body (:func:`not_modified`).
"""

from __future__ import annotations

import gzip
import hashlib
from dataclasses import dataclass

from tiletune.client.wire import ConfigBundle, KernelInfo
from tiletune.kernels import DeviceLimits, all_declarations
from tiletune.kernels.info import kernel_info
from tiletune.service.database import Database
from tiletune.service.entries import CANONICAL, WIRE
from tiletune.service.fleet import chip_by_name, chip_limits
from tiletune.service.index import BestIndex, Snapshot
from tiletune.service.singleflight import SingleFlight
from tiletune.service.specs import chip_dependent

#: gzip level of the cached bodies: built once, sent many times, so smaller beats faster.
GZIP_LEVEL = 6
#: (chip, kernel) bundles kept at most (any reader may name any chip); emptied when full.
MAX_BUNDLES = 256


@dataclass(frozen=True)
class Export:
    """One bundle, serialised: its tag, identity and gzip bodies, and the chip's index version it is of."""

    tag: str
    body: bytes
    gzipped: bytes
    version: int

    def etag(self, gzipped: bool) -> str:
        """The strong ETag of one representation."""
        return f'"{self.tag}-gzip"' if gzipped else f'"{self.tag}"'


class Exports:
    """Cached export bodies per (chip, kernel); see the module docstring."""

    def __init__(self, db: Database, index: BestIndex) -> None:
        self.db = db
        self.index = index
        self._bundles: dict[tuple[str, str | None], Export] = {}
        self._flights: SingleFlight[Export] = SingleFlight()

    @property
    def builds(self) -> int:
        """Bundles built so far (one per change and (chip, kernel), whatever the requests)."""
        return self._flights.runs

    async def get(self, chip: str, kernel: str | None) -> Export:
        """The bundle of ``chip`` (and ``kernel``) as the index holds it now."""
        snapshot = await self.index.current()
        key = (chip, kernel)
        version = snapshot.chip_versions.get(chip, 0)
        cached = self._bundles.get(key)
        if cached is not None and cached.version == version:
            return cached
        return await self._flights.run((chip, kernel, version), lambda: self._build(snapshot, key))

    def _build(self, snapshot: Snapshot, key: tuple[str, str | None]) -> Export:
        chip, kernel = key
        version = snapshot.chip_versions.get(chip, 0)
        kernels = all_declarations()
        specs = list(kernels.values()) if kernel is None else [kernels[kernel]] if kernel in kernels else []
        chosen = [item for item in snapshot.by_chip.get(chip, {}).items() if kernel in (None, item[0][0])]
        chosen.sort(key=lambda item: (item[0][0], item[0][2], item[0][3], item[0][1]))
        entries = [entry for _, entry in chosen]
        canonical = "[" + ",".join(entry[CANONICAL] for entry in entries) + "]"
        checksum = hashlib.sha256(canonical.encode()).hexdigest()
        limits = self._limits(chip) if any(chip_dependent(spec) for spec in specs) else None
        infos = [kernel_info(spec, limits) for spec in specs]
        tag = _tag(chip, infos, checksum)
        cached = self._bundles.get(key)
        if cached is not None and cached.tag == tag:
            export = Export(tag, cached.body, cached.gzipped, max(cached.version, version))
        else:
            shell = ConfigBundle(
                exported_at=self.db.clock(), chip=chip, kernels=infos, configs=[], checksum=checksum
            ).model_dump_json()
            # The entries go where the empty list is: a JSON string cannot hold `"configs":[]` unescaped.
            head, tail = shell.encode().split(b'"configs":[]', 1)
            body = b"".join((head, b'"configs":[', b",".join(entry[WIRE] for entry in entries), b"]", tail))
            export = Export(tag, body, gzip.compress(body, GZIP_LEVEL, mtime=0), version)
        if len(self._bundles) >= MAX_BUNDLES and key not in self._bundles:
            self._bundles.clear()
        current = self._bundles.get(key)
        if current is None or current.version <= export.version:
            self._bundles[key] = export
        return export

    def _limits(self, chip: str) -> DeviceLimits | None:
        """The limits ``chip`` registered (its kernels' values depend on them), ``None`` when unknown."""
        with self.db.read() as session:
            row = chip_by_name(session, chip)
            return chip_limits(row) if row is not None else None


def _tag(chip: str, kernels: list[KernelInfo], checksum: str) -> str:
    infos = ",".join(info.model_dump_json() for info in kernels)
    return hashlib.sha256(f"{chip}\n{infos}\n{checksum}".encode()).hexdigest()[:40]


def accepts_gzip(accept_encoding: str) -> bool:
    """True when an ``Accept-Encoding`` value accepts ``gzip`` (named or ``*``, with q above 0)."""
    accepted = False
    for part in accept_encoding.lower().split(","):
        name, _, params = part.strip().partition(";")
        name = name.strip()
        if name not in ("gzip", "x-gzip", "*"):
            continue
        quality = 1.0
        for param in params.split(";"):
            label, _, value = param.strip().partition("=")
            if label.strip() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        if name != "*" and quality <= 0:
            return False  # gzip refused by name, whatever * says
        accepted = accepted or quality > 0
    return accepted


def not_modified(if_none_match: str | None, export: Export) -> bool:
    """True when ``If-None-Match`` names this bundle (either representation, weak or strong) or is ``*``."""
    if not if_none_match:
        return False
    for candidate in if_none_match.split(","):
        tag = candidate.strip()
        if tag == "*":
            return True
        tag = tag.removeprefix("W/").strip('"')
        if tag in (export.tag, f"{export.tag}-gzip"):
            return True
    return False
