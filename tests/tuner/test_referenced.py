"""Search trials timed against the kernel's default (tuner/measure/referenced.py), on the CPU."""

from __future__ import annotations

import dataclasses

from tiletune.kernels.device import CpuDevice
from tiletune.kernels.registry import get_kernel
from tiletune.tuner.measure.bench import BenchSettings, KernelBench

QUICK = BenchSettings(warmup_runs=1, min_samples=5, max_samples=20, budget_s=0.01, prune_ratio=None)
SHAPE = {"n": 4096}


def _bench(settings: BenchSettings = QUICK) -> KernelBench:
    return KernelBench(get_kernel("add"), SHAPE, "float32", CpuDevice(), None, settings)


def _other_config(bench: KernelBench) -> dict[str, int]:
    limits = bench.device.chip.limits
    default = bench.spec.default_config(bench.shape, bench.dtype, limits)
    for config in bench.spec.space(bench.shape, bench.dtype, limits):
        if config != default:
            return dict(config)
    raise AssertionError("add has one config only")


def test_the_defaults_own_time_is_the_anchor_and_is_left_as_measured() -> None:
    bench = _bench()
    default = bench.spec.default_config(bench.shape, bench.dtype, bench.device.chip.limits)
    result = bench.evaluate(default)
    assert result.measurement is not None
    assert bench.reference.anchor_ms == result.measurement.median_ms


def test_another_config_is_reported_in_the_anchors_units() -> None:
    bench = _bench()
    config = _other_config(bench)
    bench.reference.anchor_ms = 1e6  # the default "took" a thousand seconds: every ratio is scaled to it
    scaled = bench.evaluate(config).measurement
    assert scaled is not None
    assert not scaled.pruned
    assert scaled.median_ms > 1e3  # a config within 1000x of the default, times 1e6 ms
    assert scaled.p10_ms <= scaled.median_ms <= scaled.p90_ms


def test_the_first_run_against_the_default_sets_the_anchor() -> None:
    bench = _bench()
    config = _other_config(bench)
    result = bench.evaluate(config)
    assert result.measurement is not None
    assert bench.reference.anchor_ms is not None
    assert bench.reference.anchor_ms > 0


def test_off_the_trial_is_its_own_time() -> None:
    bench = _bench(dataclasses.replace(QUICK, against_default=False))
    bench.reference.anchor_ms = 1e6
    plain = bench.evaluate(_other_config(bench)).measurement
    assert plain is not None
    assert plain.median_ms < 1e3
    assert bench.reference.anchor_ms == 1e6
