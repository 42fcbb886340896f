"""The landscape of each recorded space: its local optima and how much of it climbs to the optimum.

For each recorded space (``tiletune.tuner.measure.replay``), every valid config that ran is
climbed by best-improvement hill climbing (move to the fastest neighbour while it is
faster) under two neighbourhoods: *one knob* changed (to any of its values: what local
search looks at) and *two knobs* changed. Reported per neighbourhood: the number of
local optima, their fractions of the optimum and basin shares (the share of configs
whose climb ends there), the share that ends within ``REACH`` (0.97) of the optimum, and
the mean climb length; and how many configs lie within ``REACH`` at all. A needle (few
configs within reach) whose basin is small is what a search's worst seeds miss: a seed
that never measures a config of that basin settles in another one.

Prints one JSON document on stdout::

    python benchmarks/space_basins.py [--spaces convolution_A100,...] [--replay-dir DIR] [--top 6]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from tiletune.kernels.replay.recorded import replay_spaces
from tiletune.tuner.measure.replay import ReplaySpace, load_replay
from tiletune.tuner.search.encoding import Encoding, Key

REACH = 0.97


def one_knob(enc: Encoding, key: Key) -> Iterator[Key]:
    """Keys that differ from ``key`` in one knob."""
    return enc.neighbours(key)


def two_knobs(enc: Encoding, key: Key) -> Iterator[Key]:
    """Keys that differ from ``key`` in one knob or two."""
    yield from enc.neighbours(key)
    yield from enc.pair_neighbours(key)


def climb_ends(
    times: dict[Key, float], enc: Encoding, neighbours: Callable[[Encoding, Key], Iterator[Key]]
) -> tuple[dict[Key, Key], float]:
    """Where best-improvement climbing from each key ends, and the mean number of moves."""
    fastest_near: dict[Key, Key] = {}
    for key, time_ms in times.items():
        nearby = (near for near in neighbours(enc, key) if near in times)
        best = min(nearby, key=times.__getitem__, default=key)
        fastest_near[key] = best if times[best] < time_ms else key
    ends: dict[Key, Key] = {}
    moves: dict[Key, int] = {}  # moves from the key to its end
    for start in times:
        path = [start]
        while path[-1] not in ends and fastest_near[path[-1]] != path[-1]:
            path.append(fastest_near[path[-1]])
        last = path[-1]
        end, remaining = ends.get(last, last), moves.get(last, 0)
        for steps_left, key in enumerate(reversed(path)):
            ends[key] = end
            moves[key] = remaining + steps_left
    return ends, sum(moves.values()) / len(times)


def landscape(space: ReplaySpace, top: int) -> dict[str, Any]:
    """The space's local optima and basins under one-knob and two-knob moves."""
    enc = Encoding(space.knobs)
    times = {
        enc.key(dict(zip(space.knobs, values, strict=True))): t
        for values, t in space.entries.items()
        if not isinstance(t, str)
    }
    optimum = min(times.values())
    summary: dict[str, Any] = {
        "configs_ran": len(times),
        "within_reach": sum(optimum / t >= REACH for t in times.values()),
    }
    for name, neighbours in (("one_knob", one_knob), ("two_knobs", two_knobs)):
        ends, mean_moves = climb_ends(times, enc, neighbours)
        basins = Counter(ends.values())
        optima = sorted(basins, key=times.__getitem__)
        summary[name] = {
            "local_optima": len(optima),
            "mean_moves": round(mean_moves, 2),
            "share_climbing_within_reach": round(
                sum(basins[end] for end in optima if optimum / times[end] >= REACH) / len(times), 3
            ),
            "best_optima": [
                {
                    "fraction": round(optimum / times[end], 3),
                    "basin_share": round(basins[end] / len(times), 3),
                    "config": enc.config(end),
                }
                for end in optima[:top]
            ],
        }
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--replay-dir", type=Path, default=None, help="directory of recorded spaces")
    parser.add_argument("--spaces", default="", help="comma-separated space names (default: all)")
    parser.add_argument(
        "--top", type=int, default=6, help="local optima listed per neighbourhood (default 6)"
    )
    args = parser.parse_args(argv)
    files = replay_spaces(args.replay_dir)
    wanted = args.spaces.split(",") if args.spaces else list(files)
    missing = [name for name in wanted if name not in files]
    if missing:
        print(f"--spaces: unknown {missing}; known: {sorted(files)}", file=sys.stderr)
        return 2
    document: dict[str, Any] = {"benchmark": "space_basins", "reach": REACH, "spaces": {}}
    for name in wanted:
        print(f"{name} ...", file=sys.stderr, flush=True)
        document["spaces"][name] = landscape(load_replay(files[name]), args.top)
    json.dump(document, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
