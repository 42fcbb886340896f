"""The search driver's contract, on small synthetic spaces with an invalid region."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import optuna
import pytest

from tiletune.tuner.search.search import STRATEGIES, Config, Search, SearchSpace, TpeOptions
from tiletune.tuner.search.trials import Candidate, PastOutcome, PastTrial

optuna.logging.set_verbosity(optuna.logging.WARNING)

KNOBS = {"tile": [1, 2, 4, 8, 16, 32], "buffers": [1, 2, 3, 4], "depth": [1, 2, 3]}


def too_big(config: Config) -> str | None:
    """The invalid region: the working set ``tile * buffers`` must fit 64."""
    size = config["tile"] * config["buffers"]
    return f"working set {size} exceeds 64" if size > 64 else None


def bowl_ms(config: Config) -> float:
    """A smooth synthetic time with its optimum at tile=8, buffers=2, depth=2."""
    return (
        1.0
        + (math.log2(config["tile"]) - 3) ** 2
        + (config["buffers"] - 2) ** 2
        + 0.5 * (config["depth"] - 2) ** 2
    )


OPTIMUM = {"tile": 8, "buffers": 2, "depth": 2}


def valid_configs(knobs: dict[str, list[int]], invalid: Callable[[Config], str | None]) -> list[Config]:
    configs = [dict(zip(knobs, values, strict=True)) for values in itertools.product(*knobs.values())]
    return [config for config in configs if invalid(config) is None]


def space(seeds: tuple[Config, ...] = ()) -> SearchSpace:
    return SearchSpace(knobs=KNOBS, invalid_reason=too_big, seeds=seeds)


def run(search: Search, time_ms: Callable[[Config], float] = bowl_ms, batch: int = 1) -> list[Config]:
    """Ask, measure and tell until done; every asked config in order."""
    asked: list[Config] = []
    while not search.done:
        candidates = search.ask(batch)
        if not candidates:
            break
        for candidate in candidates:
            asked.append(candidate.config)
            search.tell(candidate.trial_id, time_ms(candidate.config))
    return asked


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_each_strategy_measures_only_new_valid_configs_and_finds_the_optimum(strategy: str) -> None:
    valid = valid_configs(KNOBS, too_big)
    search = Search(space(), strategy=strategy, seed=3)
    asked = run(search)
    assert all(too_big(config) is None for config in asked)
    assert len({tuple(config.values()) for config in asked}) == len(asked)
    assert len(asked) == len(valid) == search.space_size
    assert search.stop_reason == "exhausted"
    assert search.best(1)[0] == (OPTIMUM, bowl_ms(OPTIMUM))
    assert search.ask(2) == []


def test_grid_measures_every_valid_config_exactly_once_in_order() -> None:
    search = Search(space(), strategy="grid")
    asked = run(search, batch=5)
    assert asked == valid_configs(KNOBS, too_big)
    assert search.counts.as_dict() == {"completed": len(asked), "invalid": 0, "duplicate": 0, "failed": 0}


def test_random_rejects_invalid_proposals_without_measuring_them() -> None:
    search = Search(space(), strategy="random", seed=0)
    asked = run(search)
    assert search.counts.invalid > 0  # 12 of the 72 configs are invalid: the sampler hits some
    assert all(too_big(config) is None for config in asked)


def test_tpe_finds_the_optimum_of_a_larger_space_within_a_fifth_of_it() -> None:
    knobs = {"x": list(range(10)), "y": list(range(10)), "z": list(range(6))}

    def invalid(config: Config) -> str | None:
        return "x + y too large" if config["x"] + config["y"] > 14 else None

    def time_ms(config: Config) -> float:
        return 1.0 + abs(config["x"] - 6) + 0.5 * abs(config["y"] - 3) + (config["z"] - 4) ** 2

    budget = len(valid_configs(knobs, invalid)) // 5
    for seed in range(2):
        search = Search(SearchSpace(knobs, invalid), seed=seed, max_trials=budget)
        run(search, time_ms)
        assert search.best(1)[0][0] == {"x": 6, "y": 3, "z": 4}, f"seed {seed}"


def test_history_is_the_best_so_far_after_each_measurement() -> None:
    search = Search(space(), strategy="random", seed=1, max_trials=20)
    asked = run(search)
    times = [bowl_ms(config) for config in asked]
    assert search.history == [min(times[: i + 1]) for i in range(len(times))]


def test_seeds_come_first_in_order_and_invalid_or_repeated_ones_are_skipped() -> None:
    seeds = ({"tile": 32, "buffers": 1, "depth": 3}, {"tile": 32, "buffers": 4, "depth": 1}, OPTIMUM, OPTIMUM)
    search = Search(space(seeds=seeds), seed=0)
    first = search.ask(3)
    assert [candidate.config for candidate in first[:2]] == [seeds[0], OPTIMUM]
    assert first[2].config not in (seeds[0], OPTIMUM)
    assert search.counts.invalid == 1


def test_a_seed_outside_the_knob_values_is_an_error() -> None:
    with pytest.raises(ValueError, match="outside the space"):
        Search(space(seeds=({"tile": 3, "buffers": 1, "depth": 1},)))


def test_tell_is_idempotent_per_trial_and_rejects_unknown_trials() -> None:
    search = Search(space(), seed=0)
    [candidate] = search.ask()
    search.tell(candidate.trial_id, 2.0)
    search.tell(candidate.trial_id, 1.0)
    assert search.counts.completed == 1
    assert search.history == [2.0]
    with pytest.raises(ValueError, match="trial_id"):
        search.tell(10_000, 1.0)


def test_tell_rejects_a_missing_or_non_positive_time_without_an_error() -> None:
    search = Search(space(), seed=0)
    [candidate] = search.ask()
    for bad in (None, 0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="time_ms"):
            search.tell(candidate.trial_id, bad)
    assert search.outstanding == 1


def test_a_measured_failure_is_counted_never_best_and_never_asked_again() -> None:
    search = Search(space(), strategy="random", seed=2)

    def crash_at_optimum(config: Config) -> float | None:
        return None if config == OPTIMUM else bowl_ms(config)

    asked: list[Config] = []
    while not search.done:
        for candidate in search.ask(3):
            asked.append(candidate.config)
            time_ms = crash_at_optimum(candidate.config)
            search.tell(candidate.trial_id, time_ms, None if time_ms else "wrong result")
    assert asked.count(OPTIMUM) == 1
    assert search.counts.failed == 1
    assert search.best(1)[0][0] != OPTIMUM
    assert all(config != OPTIMUM for config, _ in search.best(100))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_several_candidates_may_be_outstanding_at_once(strategy: str) -> None:
    search = Search(space(), strategy=strategy, seed=4)
    first = search.ask(4)
    second = search.ask(4)
    configs = [tuple(c.config.values()) for c in first + second]
    assert len(first) == len(second) == 4
    assert len(set(configs)) == 8
    assert search.outstanding == 8
    for candidate in reversed(first + second):
        search.tell(candidate.trial_id, bowl_ms(candidate.config))
    assert search.counts.completed == 8
    assert search.outstanding == 0


def test_ask_returns_nothing_while_the_remaining_configs_are_all_outstanding() -> None:
    knobs = {"tile": [1, 2, 4], "buffers": [1, 2]}
    search = Search(SearchSpace(knobs, lambda config: None), seed=0)
    outstanding = search.ask(10)
    assert len(outstanding) == 6
    assert search.ask() == []
    assert not search.done
    for candidate in outstanding:
        search.tell(candidate.trial_id, 1.0 + candidate.config["tile"])
    assert search.stop_reason == "exhausted"


def test_max_trials_counts_unique_valid_measurements_and_limits_outstanding_asks() -> None:
    search = Search(space(), seed=0, max_trials=7)
    first = search.ask(5)
    second = search.ask(5)
    assert (len(first), len(second)) == (5, 2)
    for candidate in first + second:
        search.tell(candidate.trial_id, bowl_ms(candidate.config))
    assert search.counts.measured == 7
    assert search.stop_reason == "max_trials"
    assert search.ask() == []


def test_max_time_s_follows_the_injected_clock() -> None:
    now = [100.0]
    search = Search(space(), seed=0, max_time_s=10.0, clock=lambda: now[0])
    measured = 0
    while not search.done:
        for candidate in search.ask():
            search.tell(candidate.trial_id, bowl_ms(candidate.config))
            measured += 1
            now[0] += 3.0
    assert search.stop_reason == "max_time"
    assert measured == 4  # at 100, 103, 106, 109; the clock reads 112 after the fourth
    assert search.ask() == []


def test_patience_stops_after_that_many_measurements_without_improvement() -> None:
    search = Search(space(), strategy="grid", patience=5)
    asked = run(search, time_ms=lambda config: 1.0)
    assert search.stop_reason == "patience"
    assert len(asked) == 6  # the first sets the best, five more fail to improve it


def test_patience_ignores_improvements_below_the_relative_margin() -> None:
    times = iter([10.0, 9.99, 9.0, 8.999, 8.998, 1.0])
    search = Search(space(), strategy="grid", patience=2, min_improvement=0.01)
    asked = run(search, time_ms=lambda config: next(times))
    assert len(asked) == 5  # 9.99 is within 1 % (1 without improvement), 9.0 is not (0), then 1, 2
    assert search.stop_reason == "patience"


def test_unknown_strategy_names_the_field_and_the_choices() -> None:
    with pytest.raises(
        ValueError, match=r"strategy: unknown strategy 'annealing'; choose one of tpe, random, grid"
    ):
        Search(space(), strategy="annealing")


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [("max_trials", {"max_trials": 0}), ("max_time_s", {"max_time_s": -1.0}), ("patience", {"patience": 0})],
)
def test_non_positive_budgets_are_rejected(field: str, kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=field):
        Search(space(), **kwargs)  # type: ignore[arg-type]


def test_bad_knobs_and_options_are_rejected() -> None:
    with pytest.raises(ValueError, match="repeats a value"):
        Search(SearchSpace({"tile": [1, 1]}, lambda config: None))
    with pytest.raises(ValueError, match="no knobs"):
        Search(SearchSpace({}, lambda config: None))
    with pytest.raises(ValueError, match="options"):
        TpeOptions(model_share=0.8, local_share=0.5)


def test_tpe_without_a_model_still_respects_the_contract() -> None:
    search = Search(space(), seed=5, options=TpeOptions(model_share=0.0))
    asked = run(search)
    assert len({tuple(config.values()) for config in asked}) == len(asked) == search.space_size
    assert search.best(1)[0][0] == OPTIMUM


def test_every_trial_is_recorded_in_the_optuna_study() -> None:
    search = Search(space(), strategy="random", seed=0)
    run(search)
    kinds = [trial.user_attrs["tiletune_kind"] for trial in search.study.trials]
    counts = search.counts
    assert kinds.count("measured") == counts.completed
    assert kinds.count("invalid") == counts.invalid
    assert kinds.count("duplicate") == counts.duplicate


def past_of(search: Search, asked: list[Candidate], told: dict[int, float | str]) -> list[PastTrial]:
    """What a record kept outside the search holds of ``asked``: outcomes told, the rest outstanding."""
    past = []
    for candidate in asked:
        outcome = told.get(candidate.trial_id)
        if isinstance(outcome, float):
            past.append(PastTrial(candidate.trial_id, candidate.config, "measured", time_ms=outcome))
        elif isinstance(outcome, str):
            kind: PastOutcome = "abandoned" if outcome == "abandoned" else "failed"
            past.append(PastTrial(candidate.trial_id, candidate.config, kind, reason=outcome))
        else:
            past.append(PastTrial(candidate.trial_id, candidate.config, "outstanding"))
    return past


def test_a_search_rebuilt_from_its_past_trials_resumes_it() -> None:
    first = Search(space(), seed=0, max_trials=10)
    asked = first.ask(10)
    told: dict[int, float | str] = {c.trial_id: bowl_ms(c.config) for c in asked}
    for candidate in asked:
        first.tell(candidate.trial_id, bowl_ms(candidate.config))
    assert [c.trial_id for c in asked] == list(range(10))  # the search's own ids, from 0
    assert first.ask(1) == []  # max_trials reached: nothing more is asked
    resumed = Search(space(), seed=1, max_trials=20, past=past_of(first, asked, told))
    # what was measured is taken up; proposals answered at once (invalid, duplicate) are not past trials
    assert (resumed.counts.completed, resumed.counts.failed) == (first.counts.completed, first.counts.failed)
    assert resumed.best(3) == first.best(3)
    more = run(resumed)
    assert len(more) == 10
    assert not {tuple(c.config.values()) for c in asked} & {tuple(c.values()) for c in more}


def test_an_abandoned_candidate_is_asked_again_first_and_counts_in_no_budget() -> None:
    search = Search(space(), seed=0, max_trials=5)
    first, second = search.ask(2)
    search.tell(first.trial_id, bowl_ms(first.config))
    search.abandon(second.trial_id, "lease expired")
    search.abandon(second.trial_id)  # again: nothing happens
    assert search.outstanding == 0
    assert search.counts.completed == 1
    (again,) = search.ask(1)
    assert again.config == second.config
    assert again.trial_id != second.trial_id
    search.tell(second.trial_id, 1.0)  # the abandoned trial's late result is ignored
    assert search.counts.completed == 1
    with pytest.raises(ValueError, match="trial_id"):
        search.abandon(999)


def test_a_resumed_search_takes_up_outstanding_failed_and_abandoned_trials() -> None:
    first = Search(space(), seed=0, max_trials=8)
    a, b, c, d = first.ask(4)
    told: dict[int, float | str] = {
        a.trial_id: bowl_ms(a.config),
        b.trial_id: "abandoned",
        d.trial_id: "crashed",
    }
    resumed = Search(space(), seed=0, max_trials=8, past=past_of(first, [a, b, c, d], told))
    assert resumed.outstanding_ids == [c.trial_id]
    assert resumed.counts.completed == 1
    assert resumed.counts.failed == 1
    (again,) = resumed.ask(1)
    assert again.config == b.config
    assert again.trial_id == d.trial_id + 1  # new ids continue after the past ones
    resumed.tell(c.trial_id, bowl_ms(c.config))
    assert resumed.counts.completed == 2
    resumed.tell(c.trial_id, 1.0)  # told again: nothing happens
    assert resumed.counts.completed == 2


def test_the_model_carries_a_trend_to_values_not_measured_yet() -> None:
    """Time halves with every larger tile: measured up to the 7th value, the model asks beyond it.

    (Without trends every unmeasured value looks alike and the first, the slow
    second value, would be asked.)
    """
    tiles = [1 << p for p in range(10)]
    measured = [{"tile": tile} for tile in tiles[0:7:2]]
    options = TpeOptions(n_startup=0, model_share=1.0, local_share=0.0, model_temperature=0.0)
    halving = SearchSpace({"tile": tiles}, lambda config: None, seeds=measured)
    search = Search(halving, seed=0, options=options)
    for _ in measured:
        (candidate,) = search.ask(1)
        search.tell(candidate.trial_id, 1024 / candidate.config["tile"])
    (proposed,) = search.ask(1)
    assert proposed.config["tile"] > tiles[6]
