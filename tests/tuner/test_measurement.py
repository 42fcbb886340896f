"""A run's measurements: the spread of configs timed interleaved is net of the run's drift."""

from __future__ import annotations

import math
import random

from tiletune.tuner.measure.measurement import Measurement, interleaved_measurements
from tiletune.tuner.search.finalists import Timing, clearly_faster


def _drifting_run(rounds: int = 200, seed: int = 0) -> list[list[float]]:
    """Two configs, the second 5 % slower, on a machine whose speed wanders by up to 2x from
    round to round, plus 1 % noise of each sample's own."""
    rng = random.Random(seed)
    fast, slow = [], []
    for _ in range(rounds):
        drift = 1.0 + rng.random()
        fast.append(1.00 * drift * (1 + 0.01 * rng.gauss(0, 1)))
        slow.append(1.05 * drift * (1 + 0.01 * rng.gauss(0, 1)))
    return [fast, slow]


def _timing(measurement: Measurement, name: str) -> Timing:
    return Timing(
        {"c": ord(name)}, measurement.median_ms, measurement.p90_ms, measurement.p10_ms, measurement.samples
    )


def test_medians_are_each_configs_own_and_the_spread_loses_the_drift() -> None:
    run = _drifting_run()
    plain = [Measurement.from_samples(samples) for samples in run]
    net = interleaved_measurements(run, [1, 1])
    for own, corrected in zip(plain, net, strict=True):
        assert corrected.median_ms == own.median_ms
        assert corrected.min_ms == own.min_ms
        assert corrected.samples == own.samples == 200
        assert corrected.p10_ms < corrected.median_ms < corrected.p90_ms
        assert (corrected.p90_ms - corrected.p10_ms) < 0.2 * (own.p90_ms - own.p10_ms)


def test_a_gain_hidden_by_the_drift_is_shown_net_of_it() -> None:
    run = _drifting_run()
    plain = [Measurement.from_samples(samples) for samples in run]
    net = interleaved_measurements(run, [1, 1])
    assert not clearly_faster(_timing(plain[0], "a"), _timing(plain[1], "b"))
    assert clearly_faster(_timing(net[0], "a"), _timing(net[1], "b"))
    assert not clearly_faster(_timing(net[1], "b"), _timing(net[0], "a"))


def test_the_spread_of_independent_noise_is_kept_whatever_the_number_of_configs() -> None:
    """Without drift the net spread is the samples' own: the widening undoes the round mean's
    share of each config's noise, for two configs as for five."""
    rng = random.Random(1)
    for count in (2, 5):
        run = [[1.0 + 0.05 * rng.gauss(0, 1) for _ in range(4000)] for _ in range(count)]
        plain = [Measurement.from_samples(samples) for samples in run]
        for own, corrected in zip(plain, interleaved_measurements(run, [1] * count), strict=True):
            assert math.isclose(corrected.p90_ms - corrected.p10_ms, own.p90_ms - own.p10_ms, rel_tol=0.1)


def test_one_config_uneven_rounds_or_a_zero_sample_keep_the_plain_spread() -> None:
    one = [[1.0, 2.0, 3.0, 4.0, 5.0]]
    assert interleaved_measurements(one, [3]) == [Measurement.from_samples(one[0], launches=3)]
    uneven = [[1.0, 2.0, 3.0], [1.0, 2.0]]
    assert interleaved_measurements(uneven, [1, 1]) == [Measurement.from_samples(s) for s in uneven]
    zero = [[0.0, 2.0, 3.0], [1.0, 2.0, 3.0]]
    assert interleaved_measurements(zero, [1, 1]) == [Measurement.from_samples(s) for s in zero]
