"""The finalist and winner policy shared by local tuning and the server."""

from __future__ import annotations

from tiletune.tuner.search.finalists import Timing, clearly_faster, finalists, judge

A = {"tile": 1}
B = {"tile": 2}
DEFAULT = {"tile": 3}
INCUMBENT = {"tile": 4}


def test_finalists_are_the_top_then_the_default_then_the_incumbent_each_once() -> None:
    assert finalists([A, B], DEFAULT, INCUMBENT) == [A, B, DEFAULT, INCUMBENT]
    assert finalists([A, DEFAULT], DEFAULT, A) == [A, DEFAULT]
    assert finalists([A], None) == [A]


def test_clearly_faster_needs_the_p90_below_the_others_median() -> None:
    assert clearly_faster(Timing(A, 1.0, 1.2), Timing(B, 1.3, 1.4))
    assert not clearly_faster(Timing(A, 1.0, 1.3), Timing(B, 1.3, 1.4))
    assert not clearly_faster(Timing(A, 1.0, 1.5), Timing(B, 1.3, 1.4))
    assert clearly_faster(Timing(A, 1.0), Timing(B, 1.01))  # no p90: the median stands for it


def test_the_fastest_of_the_run_wins_and_replaces_a_slower_incumbent() -> None:
    verdict = judge(
        [Timing(A, 2.0, 2.1), Timing(DEFAULT, 3.0, 3.1), Timing(INCUMBENT, 2.5, 2.6)], DEFAULT, INCUMBENT
    )

    assert verdict is not None
    assert (verdict.winner, verdict.winner_ms, verdict.default_ms, verdict.promote) == (A, 2.0, 3.0, True)


def test_a_winner_within_the_spread_of_the_default_leaves_the_default_the_answer() -> None:
    # A's median is 5 % below the default's, but one in ten of its samples is slower than
    # the default's median: the run does not show it is faster.
    verdict = judge([Timing(A, 0.95, 1.08), Timing(DEFAULT, 1.0, 1.1)], DEFAULT)

    assert verdict is not None
    assert (verdict.winner, verdict.winner_ms, verdict.default_ms, verdict.promote) == (
        DEFAULT,
        1.0,
        1.0,
        True,
    )


def test_a_winner_clearly_beyond_the_spread_replaces_the_default() -> None:
    verdict = judge([Timing(A, 0.8, 0.85), Timing(DEFAULT, 1.0, 1.1)], DEFAULT)

    assert verdict is not None
    assert (verdict.winner, verdict.promote) == (A, True)


def test_the_fastest_of_those_clearly_beating_the_default_wins_not_a_noisy_faster_one() -> None:
    noisy = Timing(A, 0.7, 1.2)  # fastest median, but its spread reaches past the default
    steady = Timing(B, 0.8, 0.82)
    verdict = judge([noisy, steady, Timing(DEFAULT, 1.0, 1.05)], DEFAULT)

    assert verdict is not None
    assert (verdict.winner, verdict.winner_ms) == (B, 0.8)


def test_a_winner_within_the_spread_of_the_incumbent_leaves_the_incumbent() -> None:
    verdict = judge(
        [Timing(A, 0.9, 1.02), Timing(INCUMBENT, 1.0, 1.05), Timing(DEFAULT, 2.0, 2.1)], DEFAULT, INCUMBENT
    )

    assert verdict is not None
    assert (verdict.winner, verdict.winner_ms, verdict.default_ms, verdict.promote) == (
        INCUMBENT,
        1.0,
        2.0,
        False,
    )


def test_an_incumbent_faster_in_the_same_run_stays() -> None:
    verdict = judge([Timing(A, 2.0), Timing(INCUMBENT, 1.9)], DEFAULT, INCUMBENT)

    assert verdict is not None
    assert verdict.winner == INCUMBENT
    assert not verdict.promote


def test_the_default_replaces_an_incumbent_it_clearly_beats() -> None:
    verdict = judge(
        [Timing(A, 1.0, 1.2), Timing(DEFAULT, 1.05, 1.1), Timing(INCUMBENT, 1.3, 1.4)], DEFAULT, INCUMBENT
    )

    assert verdict is not None
    assert (verdict.winner, verdict.promote) == (DEFAULT, True)


def test_a_winner_that_is_the_incumbent_is_not_promoted_again_and_an_unmeasured_one_loses() -> None:
    same = judge([Timing(INCUMBENT, 1.0), Timing(A, 2.0)], DEFAULT, INCUMBENT)
    unmeasured = judge([Timing(A, 2.0)], DEFAULT, INCUMBENT)

    assert same is not None
    assert not same.promote
    assert unmeasured is not None
    assert unmeasured.promote
    assert unmeasured.default_ms is None


def test_a_run_where_nothing_ran_decides_nothing() -> None:
    assert judge([], DEFAULT) is None
