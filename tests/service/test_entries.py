"""The index's entries: invisible to the garbage collector, and a change copies only its shards.

- An entry made of a best config (its bodies and shape) is untracked by the collector after its
  first young collection, so full collections never scan the store; the entry still gives back
  the document it was made of and its shape.
- :meth:`Entries.changed` leaves the map it was called on as it was, shares every shard the
  change does not touch, and holds every key once (length, lookups, iteration).
"""

from __future__ import annotations

import gc
import json
from datetime import UTC, datetime

from tiletune.client.wire import BestConfigPublic, LookupPublic
from tiletune.kernels import DeviceLimits
from tiletune.service.entries import (
    CANONICAL,
    LOOKUP_BODY,
    SHARDS,
    WIRE,
    Entries,
    Entry,
    EntryKey,
    entry_best,
    entry_shape,
    make_entry,
)

LIMITS = DeviceLimits(local_memory_bytes=1 << 20)
CHIP = "cpu/Entries Chip/2c"


def best(n: int) -> BestConfigPublic:
    return BestConfigPublic(
        kernel="add",
        kernel_version=1,
        shape={"n": n},
        shape_key=f"n={n}",
        dtype="float32",
        chip=CHIP,
        config={"tile_size": 256, "buffer_num": 2, "pipeline_depth": 2},
        median_ms=1.0,
        default_ms=1.5,
        promoted_at=datetime(2026, 12, 7, tzinfo=UTC),
        software={"torch": "2.13.0"},
    )


def key(n: int) -> EntryKey:
    return ("add", 1, f"n={n}", "float32", CHIP)


def test_an_entry_is_untracked_by_the_collector_and_gives_back_its_document() -> None:
    made = [make_entry(best(n), LIMITS) for n in range(1024, 1024 + 64)]
    gc.collect(0)
    assert not any(gc.is_tracked(entry) for entry in made)
    entry = made[0]
    assert entry_best(entry) == best(1024)
    assert entry_shape(entry) == {"n": 1024}
    assert json.loads(entry[CANONICAL]) == json.loads(entry[WIRE])
    answer = LookupPublic.model_validate_json(entry[LOOKUP_BODY])
    assert (answer.match, answer.best, answer.config) == ("exact", best(1024), best(1024).config)
    assert answer.knob_values is not None
    assert "tile_size" in answer.knob_values


def test_a_change_copies_only_the_shards_it_touches() -> None:
    entry: Entry = make_entry(best(1024), LIMITS)
    first = Entries().changed({key(n): entry for n in range(1000)})
    second = first.changed({key(5000): entry, key(3): entry})
    assert (len(first), len(second)) == (1000, 1001)
    assert first.find(key(5000)) is None
    assert second.find(key(5000)) is entry
    assert sorted(second) == sorted([key(n) for n in range(1000)] + [key(5000)])
    shared = sum(a is b for a, b in zip(first._shards, second._shards, strict=True))
    assert shared >= SHARDS - 2
    assert first.changed({}) is first
    assert key(3) in second
    assert key(4000) not in second
