"""The finalist and winner policy shared by local tuning and the server."""

from __future__ import annotations

from tiletune.tuner.search.finalists import MIN_GAIN, Timing, clearly_faster, finalists, judge, median_error

A = {"tile": 1}
B = {"tile": 2}
DEFAULT = {"tile": 3}
INCUMBENT = {"tile": 4}


def test_finalists_are_the_top_then_the_default_then_the_incumbent_each_once() -> None:
    assert finalists([A, B], DEFAULT, INCUMBENT) == [A, B, DEFAULT, INCUMBENT]
    assert finalists([A, DEFAULT], DEFAULT, A) == [A, DEFAULT]
    assert finalists([A], None) == [A]


def test_clearly_faster_needs_the_gain_and_two_errors_of_the_medians() -> None:
    # 200 samples with median - p10 of 0.1 ms: each median known to about 0.0069 ms
    steady = Timing(B, 1.0, 1.1, 0.9, 200)
    error = median_error(steady)
    assert error is not None
    assert abs(error - 1.2533 * (0.1 / 1.2816) / 200**0.5) < 1e-12
    assert clearly_faster(Timing(A, 0.95, 1.05, 0.85, 200), steady)  # 5 % > 2 % + 2 errors (2 %)
    assert not clearly_faster(Timing(A, 0.965, 1.065, 0.865, 200), steady)  # 3.5 % < 2 % + 2 errors
    assert not clearly_faster(Timing(A, 1.0 - MIN_GAIN / 2, 1.0, 1.0, 10**6), Timing(B, 1.0, 1.0, 1.0, 10**6))
    # the same medians from 10 samples: not shown by the run
    assert not clearly_faster(Timing(A, 0.95, 1.05, 0.85, 10), Timing(B, 1.0, 1.1, 0.9, 10))


def test_a_slow_tail_is_no_veto_when_the_medians_are_well_known() -> None:
    # 11 % faster, but its p90 (a descheduled tail) is far past the default's median: the p90
    # rule refused it; the spread below the medians shows the gain
    candidate, default = Timing(A, 1.91, 3.51, 1.72, 129), Timing(B, 2.15, 3.85, 1.87, 129)
    assert clearly_faster(candidate, default)
    assert not clearly_faster(Timing(A, 1.91, 3.51), Timing(B, 2.15, 3.85))  # no p10, no count


def test_clearly_faster_needs_the_p90_below_the_others_median_without_p10_or_samples() -> None:
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


VENDOR = {"vendor": 1}


def test_torch_op_is_a_finalist_after_the_incumbent() -> None:
    assert finalists([A], DEFAULT, INCUMBENT, VENDOR) == [A, DEFAULT, INCUMBENT, VENDOR]
    assert finalists([VENDOR, A], DEFAULT, VENDOR, VENDOR) == [VENDOR, A, DEFAULT]


def test_torch_op_is_the_answer_unless_a_config_clearly_beats_it() -> None:
    # A is faster than torch's op, but within the run's spread: torch's op stays the answer
    verdict = judge(
        [Timing(A, 1.0, 1.03), Timing(DEFAULT, 1.5, 1.51), Timing(VENDOR, 1.02, 1.03)], DEFAULT, vendor=VENDOR
    )
    assert verdict is not None
    assert (verdict.winner, verdict.winner_ms, verdict.default_ms, verdict.vendor_ms) == (
        VENDOR,
        1.02,
        1.5,
        1.02,
    )


def test_a_config_must_clearly_beat_torch_op_and_the_default() -> None:
    # A beats torch's op but not the default: the default, which beats torch's op, is the answer
    measured = [Timing(A, 1.0, 1.01), Timing(DEFAULT, 1.005, 1.006), Timing(VENDOR, 2.0, 2.01)]
    verdict = judge(measured, DEFAULT, vendor=VENDOR)
    assert verdict is not None
    assert verdict.winner == DEFAULT
    # A beats both: A
    verdict = judge(
        [Timing(A, 1.0, 1.01), Timing(DEFAULT, 1.5, 1.51), Timing(VENDOR, 2.0, 2.01)], DEFAULT, vendor=VENDOR
    )
    assert verdict is not None
    assert (verdict.winner, verdict.vendor_ms) == (A, 2.0)


def test_without_torch_op_in_the_run_the_default_is_the_baseline_again() -> None:
    # a worker that cannot run torch's op reports it failed: it is not measured
    verdict = judge([Timing(A, 1.0, 1.01), Timing(DEFAULT, 1.5, 1.51)], DEFAULT, vendor=VENDOR)
    assert verdict is not None
    assert (verdict.winner, verdict.vendor_ms) == (A, None)


def test_an_incumbent_torch_op_is_kept_unless_clearly_beaten() -> None:
    measured = [Timing(A, 1.0, 1.03), Timing(DEFAULT, 1.5, 1.51), Timing(VENDOR, 1.01, 1.02)]
    verdict = judge(measured, DEFAULT, VENDOR, VENDOR)
    assert verdict is not None
    assert (verdict.winner, verdict.promote) == (VENDOR, False)
