"""The finalist and winner policy shared by local tuning and the server."""

from __future__ import annotations

from tiletune.tuner.search.finalists import finalists, judge

A = {"tile": 1}
B = {"tile": 2}
DEFAULT = {"tile": 3}
INCUMBENT = {"tile": 4}


def test_finalists_are_the_top_then_the_default_then_the_incumbent_each_once() -> None:
    assert finalists([A, B], DEFAULT, INCUMBENT) == [A, B, DEFAULT, INCUMBENT]
    assert finalists([A, DEFAULT], DEFAULT, A) == [A, DEFAULT]
    assert finalists([A], None) == [A]


def test_the_fastest_of_the_run_wins_and_replaces_a_slower_incumbent() -> None:
    verdict = judge([(A, 2.0), (DEFAULT, 3.0), (INCUMBENT, 2.5)], DEFAULT, INCUMBENT)

    assert verdict is not None
    assert (verdict.winner, verdict.winner_ms, verdict.default_ms, verdict.promote) == (A, 2.0, 3.0, True)


def test_an_incumbent_faster_in_the_same_run_stays() -> None:
    verdict = judge([(A, 2.0), (INCUMBENT, 1.9)], DEFAULT, INCUMBENT)

    assert verdict is not None
    assert verdict.winner == INCUMBENT
    assert not verdict.promote


def test_a_winner_that_is_the_incumbent_is_not_promoted_again_and_an_unmeasured_one_loses() -> None:
    same = judge([(INCUMBENT, 1.0), (A, 2.0)], DEFAULT, INCUMBENT)
    unmeasured = judge([(A, 2.0)], DEFAULT, INCUMBENT)

    assert same is not None
    assert not same.promote
    assert unmeasured is not None
    assert unmeasured.promote
    assert unmeasured.default_ms is None


def test_a_run_where_nothing_ran_decides_nothing() -> None:
    assert judge([], DEFAULT) is None
