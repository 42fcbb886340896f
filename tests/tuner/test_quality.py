"""Search quality figures: fraction of the optimum, log-axis AUC, leave-one-device-out choice."""

from __future__ import annotations

import math

import pytest

from tiletune.tuner.search.quality import (
    budget_needed,
    budget_trials,
    choose_leave_one_device_out,
    device_of,
    fraction_at,
    log_auc,
    trials_to_reach,
)

INF = math.inf


def test_budget_trials_rounds_up_and_is_at_least_one() -> None:
    assert budget_trials(4362, 5) == 219
    assert budget_trials(4362, 2) == 88
    assert budget_trials(10, 0.1) == 1


def test_fraction_is_zero_before_a_success_and_keeps_the_last_best_after_the_run() -> None:
    history = [INF, 4.0, 2.0]
    assert fraction_at(history, 1, 1.0) == 0.0
    assert fraction_at(history, 2, 1.0) == 0.25
    assert fraction_at(history, 10, 1.0) == 0.5
    assert fraction_at([], 5, 1.0) == 0.0


def test_log_auc_of_a_constant_curve_is_that_constant() -> None:
    assert log_auc([2.0] * 100, 1.0, 1, 100) == pytest.approx(0.5)
    assert log_auc([1.0] * 100, 1.0, 3, 50) == pytest.approx(1.0)


def test_log_auc_weighs_each_doubling_of_the_budget_equally() -> None:
    # Fraction 0 on [1, 10), 1 on [10, 100]: half of the log axis from 1 to 100.
    history = [INF] * 9 + [1.0] * 91
    assert log_auc(history, 1.0, 1, 100) == pytest.approx(0.5)
    # On a linear axis the same run would score about 0.91: early finds count more on a log axis.
    late = [INF] * 49 + [1.0] * 51
    assert log_auc(late, 1.0, 1, 100) == pytest.approx(math.log(100 / 50) / math.log(100))


def test_log_auc_at_one_budget_is_the_fraction_there_and_bad_ranges_are_errors() -> None:
    assert log_auc([4.0, 2.0], 1.0, 2, 2) == 0.5
    with pytest.raises(ValueError, match="first <= last"):
        log_auc([1.0], 1.0, 5, 2)
    with pytest.raises(ValueError, match="1 <= first"):
        log_auc([1.0], 1.0, 0, 2)


def test_trials_to_reach_is_the_first_measurement_at_the_fraction_or_none() -> None:
    history = [INF, 4.0, 2.0, 1.03, 1.0]
    assert trials_to_reach(history, 1.0, 0.97) == 4
    assert trials_to_reach(history, 1.0, 1.0) == 5
    assert trials_to_reach(history, 1.0, 0.25) == 2
    assert trials_to_reach(history[:3], 1.0, 0.97) is None
    assert trials_to_reach([], 1.0, 0.5) is None
    with pytest.raises(ValueError, match="reach"):
        trials_to_reach(history, 1.0, 0.0)


def test_budget_needed_counts_a_seed_that_never_reached_as_the_worst() -> None:
    assert budget_needed([10, 30, 20], 1000) == {"median": 2.0, "worst": 3.0, "per_seed": [1.0, 3.0, 2.0]}
    assert budget_needed([10, None, 20], 1000) == {"median": 2.0, "worst": None, "per_seed": [1.0, None, 2.0]}
    assert budget_needed([None, None, 5], 1000)["median"] is None
    with pytest.raises(ValueError, match="no seeds"):
        budget_needed([], 1000)


def test_device_of_a_space_name_is_all_after_the_kernel() -> None:
    assert device_of("gemm_RTX_3090") == "RTX_3090"
    assert device_of("dedispersion_MI250X") == "MI250X"
    with pytest.raises(ValueError, match="kernel"):
        device_of("gemm")


def test_leave_one_device_out_never_chooses_with_the_held_out_device() -> None:
    # "a" is best only on device X's space; "b" is best everywhere else.
    scores = {
        "a": {"k1_X": 1.0, "k2_X": 1.0, "k1_Y": 0.5, "k1_Z": 0.5},
        "b": {"k1_X": 0.0, "k2_X": 0.0, "k1_Y": 0.9, "k1_Z": 0.9},
    }
    chosen = choose_leave_one_device_out(scores)
    assert chosen == {"X": "b", "Y": "a", "Z": "a"}


def test_leave_one_device_out_breaks_ties_by_candidate_order_and_checks_its_input() -> None:
    tie = {"first": {"k_X": 0.5, "k_Y": 0.5}, "second": {"k_X": 0.5, "k_Y": 0.5}}
    assert choose_leave_one_device_out(tie) == {"X": "first", "Y": "first"}
    with pytest.raises(ValueError, match="no candidates"):
        choose_leave_one_device_out({})
    with pytest.raises(ValueError, match="same spaces"):
        choose_leave_one_device_out({"a": {"k_X": 1.0, "k_Y": 1.0}, "b": {"k_X": 1.0}})
    with pytest.raises(ValueError, match="two devices"):
        choose_leave_one_device_out({"a": {"k1_X": 1.0, "k2_X": 1.0}})
