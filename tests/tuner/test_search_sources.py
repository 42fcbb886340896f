"""The ``tpe`` strategy's sources: random floor, clipped model, stall exploration, niches, warm starts."""

from __future__ import annotations

import itertools
import math

import optuna
import pytest

from tiletune.tuner.search.encoding import Encoding, Key
from tiletune.tuner.search.neighbourhood import LocalSearch
from tiletune.tuner.search.record import Record
from tiletune.tuner.search.search import Config, Search, SearchSpace, TpeOptions
from tiletune.tuner.search.surrogate import CLIP_MIN_MEASUREMENTS, PairModel
from tiletune.tuner.search.warm_start import interleave_seeds

optuna.logging.set_verbosity(optuna.logging.WARNING)

KNOBS = {"tile": [1, 2, 4, 8, 16, 32], "buffers": [1, 2, 3, 4], "depth": [1, 2, 3]}


def bowl_ms(config: Config) -> float:
    return (
        1.0 + (math.log2(config["tile"]) - 3) ** 2 + (config["buffers"] - 2) ** 2 + (config["depth"] - 2) ** 2
    )


def run(search: Search) -> list[Config]:
    asked = []
    while not search.done:
        candidates = search.ask(1)
        if not candidates:
            break
        for candidate in candidates:
            asked.append(candidate.config)
            search.tell(candidate.trial_id, bowl_ms(candidate.config))
    return asked


def model(enc: Encoding, clip_quantile: float = 1.0) -> PairModel:
    keys = list(enc.all_keys())
    return PairModel(
        enc,
        keys,
        pair_bins=16,
        pair_prior=0.5,
        trend_prior=16.0,
        temperature=0.35,
        seed=3,
        clip_quantile=clip_quantile,
    )


def test_random_share_takes_its_turns_from_the_tpe_sampler() -> None:
    """With every share to the search's own sources, Optuna's TPE never proposes: each trial is enqueued."""
    own = TpeOptions(model_share=0.4, local_share=0.4, random_share=0.2)
    search = Search(SearchSpace(KNOBS, lambda config: None), seed=0, max_trials=40, options=own)
    run(search)
    assert all("fixed_params" in trial.system_attrs for trial in search.study.trials)
    default = Search(SearchSpace(KNOBS, lambda config: None), seed=0, max_trials=40)
    run(default)
    assert not all("fixed_params" in trial.system_attrs for trial in default.study.trials)


def test_a_random_share_keeps_the_contract_and_finds_the_optimum() -> None:
    options = TpeOptions(
        model_share=0.35,
        local_share=0.35,
        random_share=0.3,
        local_niches=True,
        stall_patience=5,
        model_clip_quantile=0.5,
    )
    search = Search(SearchSpace(KNOBS, lambda config: None), seed=1, options=options)
    asked = run(search)
    assert len({tuple(c.values()) for c in asked}) == len(asked) == 72
    assert search.best(1)[0][0] == {"tile": 8, "buffers": 2, "depth": 2}


def test_options_reject_shares_over_one_and_bad_clip_or_patience() -> None:
    with pytest.raises(ValueError, match="random_share"):
        TpeOptions(model_share=0.5, local_share=0.4, random_share=0.2)
    with pytest.raises(ValueError, match="model_clip_quantile"):
        TpeOptions(model_clip_quantile=0.0)
    with pytest.raises(ValueError, match="stall_patience"):
        TpeOptions(stall_patience=-1)


def test_a_clipped_model_ignores_how_slow_the_slow_configs_are() -> None:
    """Clipped at the median, two runs that differ only above it fit, and so propose, the same."""
    enc = Encoding(KNOBS)
    keys = list(enc.all_keys())
    measured = keys[::2]  # 36: enough for the clip (CLIP_MIN_MEASUREMENTS)
    assert len(measured) >= CLIP_MIN_MEASUREMENTS
    times = {key: bowl_ms(enc.config(key)) for key in measured}
    cut = sorted(times.values())[len(times) // 2]
    proposals = []
    for slow_factor in (1.0, 1000.0):
        clipped = model(enc, clip_quantile=0.25)
        for key in measured:
            time_ms = times[key]
            clipped.add(key, time_ms * slow_factor if time_ms > cut else time_ms)
        proposals.append([clipped.propose() for _ in range(5)])
    assert proposals[0] == proposals[1]
    unclipped = []
    for slow_factor in (1.0, 1000.0):
        plain = model(enc)
        for key in measured:
            time_ms = times[key]
            plain.add(key, time_ms * slow_factor if time_ms > cut else time_ms)
        unclipped.append([plain.propose() for _ in range(5)])
    assert unclipped[0] != unclipped[1]  # without the clip the slow outliers move the fit


def test_a_model_with_few_measurements_is_not_clipped() -> None:
    enc = Encoding(KNOBS)
    keys = list(enc.all_keys())
    proposals = []
    for clip in (1.0, 0.25):
        fitted = model(enc, clip_quantile=clip)
        for key in keys[: CLIP_MIN_MEASUREMENTS - 1]:
            fitted.add(key, bowl_ms(enc.config(key)))
        proposals.append([fitted.propose() for _ in range(5)])
    assert proposals[0] == proposals[1]


def test_a_draw_at_temperature_zero_is_the_posterior_means_choice() -> None:
    enc = Encoding(KNOBS)
    keys = list(enc.all_keys())
    fitted = model(enc)
    for key in keys[::4]:
        fitted.add(key, bowl_ms(enc.config(key)))
    available = [key for key in keys if key not in set(keys[::4])]
    assert fitted.propose(temperature_scale=0.0) == fitted.most_promising(available)


def test_the_record_keeps_the_best_of_each_niche() -> None:
    record = Record(min_improvement=0.0)
    record.add_time((0, 0), 5.0)
    record.add_time((1, 0), 1.0)
    record.add_time((0, 1), 3.0)
    assert record.niche_best[(0, 0)][2] == (0, 1)  # knob 0 at value 0: (0, 1) beats (0, 0)
    assert record.niche_best[(1, 0)][2] == (1, 0)
    assert record.niche_bases() == [(1, 0), (0, 1)]  # fastest first, each key once


def test_local_search_climbs_a_niche_once_the_best_basin_is_exhausted() -> None:
    enc = Encoding({"a": [0, 1, 2, 3], "b": [0, 1, 2, 3]})
    best: Key = (0, 0)
    exhausted = {best, *enc.neighbours(best)}
    usable = lambda key: key not in exhausted  # noqa: E731
    ranked = [(1.0, 1, best)]
    assert LocalSearch(enc, top=1).propose(ranked, usable, None) is None
    niche: Key = (3, 3)
    proposed = LocalSearch(enc, top=1).propose(ranked, usable, None, niches=[niche])
    assert proposed in set(enc.neighbours(niche))


def test_warm_start_seeds_interleave_the_chips_best_first_without_repeats() -> None:
    best = {
        "a": [{"tile": 8}, {"tile": 16}, {"tile": 4}],
        "b": [{"tile": 32}, {"tile": 8}],
    }
    assert interleave_seeds(best, 2) == [{"tile": 8}, {"tile": 32}, {"tile": 16}]
    assert interleave_seeds(best, 0) == []
    with pytest.raises(ValueError, match="per_chip"):
        interleave_seeds(best, -1)


def test_warm_start_seeds_are_measured_first() -> None:
    seeds = interleave_seeds(
        {"other": [{"tile": 8, "buffers": 2, "depth": 2}, {"tile": 4, "buffers": 1, "depth": 1}]}, 2
    )
    search = Search(SearchSpace(KNOBS, lambda config: None, seeds=tuple(seeds)), seed=0, max_trials=5)
    assert run(search)[:2] == seeds
    assert list(itertools.islice(search.history, 1)) == [1.0]


def test_the_diversity_floor_proposes_in_the_region_furthest_below_its_floor() -> None:
    """Measured only with tile 8, the model's floor turn goes to another value's region, and is new."""
    enc = Encoding(KNOBS)
    fitted = model(enc)
    measured = [key for key in enc.all_keys() if enc.config(key)["tile"] == 8]
    for key in measured:
        fitted.add(key, bowl_ms(enc.config(key)))
    proposed = fitted.propose_floor(0.5)
    assert proposed is not None
    assert proposed not in measured
    assert enc.config(proposed)["tile"] != 8
    assert model(enc).propose_floor(0.5) is None  # before two measurements


def test_a_floor_keeps_the_contract_and_finds_the_optimum() -> None:
    options = TpeOptions(floor_share=1.0, floor_patience=0)
    search = Search(SearchSpace(KNOBS, lambda config: None), seed=2, options=options)
    asked = run(search)
    assert len({tuple(c.values()) for c in asked}) == len(asked) == 72
    assert search.best(1)[0][0] == {"tile": 8, "buffers": 2, "depth": 2}
    with pytest.raises(ValueError, match="floor_share"):
        TpeOptions(floor_share=1.5)


def test_local_search_on_optima_climbs_another_basin_not_the_best_ones_slower_neighbours() -> None:
    """(0, 1) is beaten by its neighbour (0, 0); (3, 3) is beaten by none, so it is the next base."""
    enc = Encoding({"a": [0, 1, 2, 3], "b": [0, 1, 2, 3]})
    times: dict[Key, float] = {(0, 0): 1.0, (0, 1): 1.1, (3, 3): 2.0}
    ranked = sorted((t, order, key) for order, (key, t) in enumerate(times.items()))
    best_neighbourhood = {*times, *enc.neighbours((0, 0))}
    usable = lambda key: key not in best_neighbourhood  # noqa: E731
    plain = LocalSearch(enc, top=2)
    on_optima = LocalSearch(enc, top=2, optima=True)
    for key in times:
        plain.learn(key, times)
        on_optima.learn(key, times)
    assert plain.propose(ranked, usable, None) in set(enc.neighbours((0, 1)))
    assert on_optima.propose(ranked, usable, None) in set(enc.neighbours((3, 3)))


def test_local_search_with_pairs_looks_two_knobs_away_once_the_best_is_a_local_optimum() -> None:
    enc = Encoding({"a": [0, 1, 2, 3], "b": [0, 1, 2, 3], "c": [0, 1]})
    fitted = model(enc)
    best: Key = (0, 0, 0)
    one_knob = set(enc.neighbours(best))
    for key in (best, *one_knob):
        fitted.add(key, 1.0 if key == best else 2.0)
    usable = lambda key: key != best and key not in one_knob  # noqa: E731
    ranked = [(1.0, 0, best)]
    for pairs in (False, True):
        local = LocalSearch(enc, top=1, pairs=pairs)
        assert local.propose(ranked, usable, fitted) is None  # a sweep: no one-knob neighbour is left
        proposed = local.propose(ranked, usable, fitted)  # the model's turn
        if not pairs:
            assert proposed is None
        else:
            assert proposed is not None
            assert sum(a != b for a, b in zip(proposed, best, strict=True)) == 2


def test_local_search_on_optima_with_pairs_keeps_the_contract_and_finds_the_optimum() -> None:
    options = TpeOptions(local_optima=True, local_pairs=True)
    search = Search(SearchSpace(KNOBS, lambda config: None), seed=4, options=options)
    asked = run(search)
    assert len({tuple(c.values()) for c in asked}) == len(asked) == 72
    assert search.best(1)[0][0] == {"tile": 8, "buffers": 2, "depth": 2}
