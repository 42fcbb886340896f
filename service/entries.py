"""The index's entries: each best config as plain tuples, in a map that changes by copying a shard.

Two properties let one replica hold a million best configs without its latency following the
store's size (``docs/figures/store_size.json``):

- **An entry is invisible to the garbage collector.** An :data:`Entry` is an exact ``tuple`` of
  bytes and strings: the collector untracks such a tuple at its first young
  collection, so a full collection never scans the store (an object per entry would make every
  full collection's pause, which every request near it waits out, grow with the store).
- **A change copies one shard, not the map.** :class:`Entries` spreads its keys over
  :data:`SHARDS` dicts; :meth:`Entries.changed` copies only the shards a change touches, so a
  promotion costs the same at 10,000 configs and at 1,000,000. A map is never changed once made:
  a reader iterating one in a thread never sees it change.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Final

from tiletune.client.wire import BestConfigPublic, LookupPublic
from tiletune.kernels import DeviceLimits, Shape, all_declarations
from tiletune.service.specs import knob_values_of

#: (kernel, kernel version, canonical shape, dtype, chip name): how the index keys a best config.
EntryKey = tuple[str, int, str, str, str]

#: One best config: ``(wire, canonical, lookup_body, shape)``, made by :func:`make_entry`.
#:
#: - ``wire``: the ``BestConfigPublic`` as the export serialises it;
#: - ``canonical``: the same as ``ConfigBundle.content_checksum`` hashes it (sorted keys, no spaces);
#: - ``lookup_body``: the ``LookupPublic`` of an exact hit (every shape text of the key names it);
#: - ``shape``: the shape as JSON text.
#:
#: Flat on purpose: the collector untracks a tuple whose items are all untracked, but a tuple
#: holding another tuple only once that one is untracked, which may take a later collection.
Entry = tuple[bytes, str, bytes, str]
WIRE: Final = 0
CANONICAL: Final = 1
LOOKUP_BODY: Final = 2
SHAPE: Final = 3

#: How many dicts an :class:`Entries` spreads its keys over.
SHARDS = 256


def make_entry(best: BestConfigPublic, limits: DeviceLimits) -> Entry:
    """``best`` serialised the three ways the read routes send it (in a refresh, off the event loop)."""
    lookup = LookupPublic(
        kernel=best.kernel,
        shape=best.shape,
        dtype=best.dtype,
        chip=best.chip,
        config=best.config,
        match="exact",
        best=best,
        knob_values=_knob_values(best.kernel, best.shape, limits),
    )
    canonical = json.dumps(
        best.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), allow_nan=False
    )
    return (
        best.model_dump_json().encode(),
        canonical,
        lookup.model_dump_json().encode(),
        json.dumps(best.shape),
    )


def entry_best(entry: Entry) -> BestConfigPublic:
    """The ``BestConfigPublic`` an entry was made of (parsed again: entries keep no objects)."""
    return BestConfigPublic.model_validate_json(entry[WIRE])


def entry_shape(entry: Entry) -> Shape:
    """The entry's shape as a dict."""
    shape: Shape = json.loads(entry[SHAPE])
    return shape


def _knob_values(kernel: str, shape: Shape, limits: DeviceLimits) -> dict[str, list[int]] | None:
    """The knob values a lookup answer carries on a chip of ``limits``, or none when the kernel is
    not installed here."""
    spec = all_declarations().get(kernel)
    return knob_values_of(spec, shape, limits) if spec is not None else None


class Entries(Mapping[EntryKey, Entry]):
    """An immutable map of entries, sharded so that a change copies only the shards it touches."""

    __slots__ = ("_length", "_shards")

    def __init__(self, shards: tuple[dict[EntryKey, Entry], ...] | None = None) -> None:
        self._shards = shards if shards is not None else tuple({} for _ in range(SHARDS))
        self._length = sum(map(len, self._shards))

    @staticmethod
    def _shard_of(key: EntryKey) -> int:
        return hash(key) % SHARDS

    def __getitem__(self, key: EntryKey) -> Entry:
        return self._shards[self._shard_of(key)][key]

    def find(self, key: EntryKey) -> Entry | None:
        """The entry of ``key``, else ``None`` (one hash, one dict lookup: the exact hit's path)."""
        return self._shards[self._shard_of(key)].get(key)

    def __iter__(self) -> Iterator[EntryKey]:
        for shard in self._shards:
            yield from shard

    def __len__(self) -> int:
        return self._length

    def changed(self, changes: Mapping[EntryKey, Entry]) -> Entries:
        """A new map: this one with ``changes`` set (the touched shards copied, the others shared)."""
        if not changes:
            return self
        shards = list(self._shards)
        touched: dict[int, dict[EntryKey, Entry]] = {}
        for key, entry in changes.items():
            index = self._shard_of(key)
            if index not in touched:
                touched[index] = shards[index] = dict(shards[index])
            touched[index][key] = entry
        return Entries(tuple(shards))
