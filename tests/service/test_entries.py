"""The index's entries: invisible to the garbage collector, and a change copies only its shards;
the promotion ids a refresh skipped, asked for again as long as they may still appear.

- An entry made of a best config (its bodies and shape) is untracked by the collector after its
  first young collection, so full collections never scan the store; the entry still gives back
  the document it was made of and its shape.
- :meth:`Entries.changed` leaves the map it was called on as it was, shares every shard the
  change does not touch, and holds every key once (length, lookups, iteration).
- A skipped promotion id is asked for at every check within ``GAP_S``, then only by the backstop
  (every ``BACKSTOP_S``), and forgotten after ``LATE_S``: no refresh reads the store.
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
from tiletune.service.index import BACKSTOP_S, LATE_S, BestIndex, _Cursor

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


def test_skipped_promotion_ids_are_asked_for_often_then_at_the_backstop_then_forgotten() -> None:
    cursor = _Cursor(last_id=10, gaps={7: 0.0, 9: 50.0}, backstop_at=0.0)
    assert BestIndex._gaps_to_ask(cursor, 30.0) == [7, 9]  # both within GAP_S: every check
    assert BestIndex._gaps_to_ask(cursor, 100.0) == [9]  # 7 is older: left to the backstop
    assert sorted(BestIndex._gaps_to_ask(cursor, BACKSTOP_S)) == [7, 9]  # the backstop asks for all
    assert BestIndex._gaps_to_ask(cursor, BACKSTOP_S + 1) == []
    assert BestIndex._gaps_to_ask(cursor, LATE_S + 1) == [9]  # a backstop: 7, older than LATE_S, forgotten
    assert cursor.gaps == {9: 50.0}
