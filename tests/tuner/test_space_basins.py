"""The landscape benchmark's climb: local optima under one-knob and two-knob moves."""

from __future__ import annotations

from collections import Counter

from benchmarks.space_basins import climb_ends, one_knob, two_knobs
from tiletune.tuner.search.encoding import Encoding, Key


def test_a_basin_two_knobs_away_is_a_local_optimum_of_one_knob_moves_only() -> None:
    enc = Encoding({"a": [0, 1, 2, 3], "b": [0, 1, 2, 3]})
    times: dict[Key, float] = {key: 10.0 + key[0] + key[1] for key in enc.all_keys()}  # falls to (0, 0)
    times[(0, 0)], times[(3, 3)] = 1.0, 2.0  # and a second valley, two knobs away
    ends, moves = climb_ends(times, enc, one_knob)
    assert set(Counter(ends.values())) == {(0, 0), (3, 3)}
    assert moves > 1.0  # (1, 1) takes two moves, through (0, 1)
    assert ends[(1, 3)] == (3, 3)  # its fastest neighbour is (3, 3), which no one-knob move improves
    assert ends[(0, 2)] == (0, 0)
    ends, moves = climb_ends(times, enc, two_knobs)
    assert set(ends.values()) == {(0, 0)}
    assert moves == 15 / 16  # every other key is one two-knob move from (0, 0)
