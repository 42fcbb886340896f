"""The bench harness: statistics, stopping rules, interleaving, checks before timing."""

from __future__ import annotations

import functools
import itertools
import math
import time
from collections.abc import Callable, Sequence

import pytest
import torch

from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.device import CpuDevice, Device
from tiletune.tuner.measure.bench import (
    SAMPLE_CAP,
    BenchSettings,
    common_launches,
    measure,
    measure_interleaved,
    settle,
    time_launches_ms,
)
from tiletune.tuner.measure.check import output_mismatch
from tiletune.tuner.measure.measurement import Measurement, median_rel_ci


class ScriptedDevice(CpuDevice):
    """A CPU device whose timer returns scripted times: deterministic statistics tests."""

    def __init__(self, times_ms: list[float]) -> None:
        super().__init__()
        self._times = itertools.cycle(times_ms)

    def time_ms(self, fn: Callable[[], object]) -> float:
        fn()
        return next(self._times)


def test_measurement_statistics_from_samples() -> None:
    m = Measurement.from_samples([5.0, 1.0, 2.0, 3.0, 4.0])
    assert m.median_ms == 3.0
    assert m.min_ms == 1.0
    assert m.samples == 5
    assert m.p10_ms == pytest.approx(1.4)
    assert m.p90_ms == pytest.approx(4.6)
    assert m.spread == pytest.approx((4.6 - 1.4) / 3.0)


def test_median_ci_shrinks_with_samples_and_is_infinite_when_too_few() -> None:
    assert math.isinf(median_rel_ci([1.0, 2.0]))
    noisy = [1.0 + 0.1 * ((i * 7) % 10) for i in range(20)]
    assert median_rel_ci(noisy * 10) < median_rel_ci(noisy)
    assert median_rel_ci([2.0] * 50) == 0.0


def test_measure_stops_at_target_confidence_for_steady_times() -> None:
    settings = BenchSettings(min_samples=5, max_samples=100, budget_s=10.0, target_rel_ci=0.01)
    m = measure(lambda: None, ScriptedDevice([1.0]), settings)
    assert m.samples == 5
    assert m.median_ms == 1.0


def test_measure_keeps_sampling_noisy_times_until_budget() -> None:
    settings = BenchSettings(min_samples=5, max_samples=1000, budget_s=0.1, target_rel_ci=0.0)
    m = measure(lambda: None, ScriptedDevice([1.0, 3.0]), settings)
    assert m.samples == 50  # 100 ms of budget at 2 ms a sample on average
    assert m.median_ms == 2.0


def test_measure_prunes_configs_far_slower_than_the_best() -> None:
    settings = BenchSettings(warmup_runs=1, min_samples=3, budget_s=10.0, target_rel_ci=0.0, prune_ratio=2.0)
    far_slower = measure(lambda: None, ScriptedDevice([10.0, 11.0]), settings, best_known_ms=1.0)
    assert far_slower.pruned
    assert far_slower.samples == 1  # the warm-up run alone shows it cannot win
    slower = measure(lambda: None, ScriptedDevice([3.0]), settings, best_known_ms=1.0)
    assert slower.pruned
    assert slower.samples == 1  # its fastest timed sample is over 2x the best
    noisy = measure(lambda: None, ScriptedDevice([1.0, 1.0, 2.5, 2.5]), settings, best_known_ms=1.0)
    assert noisy.pruned
    assert noisy.samples == 3  # one fast sample, but the median of min_samples is over 2x
    unpruned = measure(lambda: None, ScriptedDevice([1.5]), settings, best_known_ms=1.0)
    assert not unpruned.pruned


def test_a_slow_first_call_of_a_microsecond_kernel_prunes_nothing() -> None:
    """One cold call (60 µs for a 20 µs softmax on the 2-core VM) is no evidence: the warm-up
    goes on to samples of many launches, and only a run as long as a sample may prune."""
    settings = BenchSettings(warmup_runs=1, min_samples=3, budget_s=10.0, target_rel_ci=0.01, prune_ratio=1.5)
    # per run: one call 0.05 ms, then 20 calls in 0.2 ms, then 100 calls in 1 ms each
    cold_first = ScriptedDevice([0.05, 0.2, *[1.0] * 20])
    fast = measure(lambda: None, cold_first, settings, best_known_ms=0.01)
    assert not fast.pruned
    assert fast.median_ms == pytest.approx(0.01)
    assert fast.launches_per_sample == 100
    # 0.05 ms a call all along: pruned on the first run long enough to be a sample (20 calls, 1 ms)
    slow = measure(lambda: None, ScriptedDevice([0.05, 1.0]), settings, best_known_ms=0.01)
    assert slow.pruned
    assert slow.median_ms == pytest.approx(0.05)
    assert slow.samples == 1


def test_a_trials_checked_run_is_not_timed_and_prunes_nothing() -> None:
    """The checked run (one cold call that allocates the outputs) is run, not timed: the device's
    timer answers the warm-up and the samples alone, and the cold one-call warm-up prunes nothing.
    Had the checked run taken the first answer, the ten-call warm-up would read 1 ms (0.1 ms a
    call, 10x the best) and prune the trial."""
    from tiletune.kernels.registry import get_kernel
    from tiletune.tuner.measure.bench import KernelBench

    settings = BenchSettings(warmup_runs=1, budget_s=10, prune_ratio=1.5, against_default=False)
    # the timer's answers in turn: a one-call run 0.1 ms (cold), ten calls in 0.1 ms, then 1 ms a run
    device = ScriptedDevice([0.1, 0.1, *[1.0] * 20])
    bench = KernelBench(get_kernel("add"), {"n": 4096}, "float32", device, settings=settings)
    result = bench.evaluate({"tile_size": 1024, "buffer_num": 2, "pipeline_depth": 2}, best_known_ms=0.01)
    assert result.measurement is not None, result
    assert not result.measurement.pruned
    assert result.measurement.median_ms == pytest.approx(0.01)


def test_a_validation_run_rotates_its_rounds_between_allocations_of_the_inputs() -> None:
    """Round i of ``compare`` runs every config on allocation i mod ``VALIDATION_INPUT_SETS`` (the
    bench's own first), each holding the same values, so a gain bound to one placement of the
    buffers shows as spread."""
    from tiletune.kernels.registry import get_kernel
    from tiletune.tuner.measure.bench import VALIDATION_INPUT_SETS, KernelBench

    add = get_kernel("add")
    seen: list[torch.Tensor] = []

    class RecordingAdd(type(add)):  # type: ignore[misc]
        def run(
            self, inputs: Sequence[torch.Tensor], config: Config, shape: Shape, backend: str = "torch"
        ) -> object:
            seen.append(inputs[0])
            return super().run(inputs, config, shape, backend)

    rounds = 2 * VALIDATION_INPUT_SETS
    settings = BenchSettings(warmup_runs=1, min_samples=rounds, budget_s=1e-6, against_default=False)
    bench = KernelBench(RecordingAdd(), {"n": 4096}, "float32", CpuDevice(), settings=settings)
    configs = [{"tile_size": t, "buffer_num": 2, "pipeline_depth": 2} for t in (256, 1024)]
    medians = bench.compare(configs)
    assert [m.samples for m in medians] == [rounds, rounds]
    pointers = [tensor.data_ptr() for tensor in seen]
    in_turn = [p for i, p in enumerate(pointers) if i == 0 or p != pointers[i - 1]]
    own = bench.inputs[0].data_ptr()
    assert len(set(in_turn)) == VALIDATION_INPUT_SETS > 1
    assert in_turn[0] == own  # warm-ups and round 0 on the bench's own allocation
    assert in_turn == in_turn[:VALIDATION_INPUT_SETS] * 2  # then round-robin, one allocation a round
    assert all(torch.equal(tensor, bench.inputs[0]) for tensor in seen)


def test_input_rotation_needs_an_allocation() -> None:
    from tiletune.tuner.measure.bench import InputRotation

    with pytest.raises(ValueError, match="at least one allocation"):
        InputRotation([])


def test_interleaved_takes_every_callable_once_a_round_in_orders_that_vary() -> None:
    calls: list[str] = []
    fns = [lambda name=name: calls.append(name) for name in "ABC"]
    settings = BenchSettings(warmup_runs=0, min_samples=30, max_samples=30, budget_s=0.0)
    results = measure_interleaved(fns, ScriptedDevice([1.0]), settings)
    assert [r.samples for r in results] == [30, 30, 30]
    rounds = ["".join(calls[i : i + 3]) for i in range(0, len(calls), 3)]
    assert all(sorted(order) == ["A", "B", "C"] for order in rounds)
    followed = {(before, after) for before, after in itertools.pairwise(calls) if before != after}
    assert followed == {(a, b) for a in "ABC" for b in "ABC" if a != b}  # each after every other
    again: list[str] = []
    measure_interleaved(
        [functools.partial(again.append, name) for name in "ABC"], ScriptedDevice([1.0]), settings
    )
    assert again == calls  # seeded: the same run, the same orders


def test_interleaved_separates_a_real_slow_and_fast_callable() -> None:
    device: Device = CpuDevice()

    def slow() -> None:
        time.sleep(0.002)

    settings = BenchSettings(warmup_runs=1, min_samples=5, max_samples=5, budget_s=0.0)
    fast_m, slow_m = measure_interleaved([lambda: None, slow], device, settings)
    assert slow_m.median_ms > 1.5
    assert fast_m.median_ms < slow_m.median_ms / 10


def test_output_mismatch_reports_shape_nan_and_wrong_values() -> None:
    expected = torch.ones(4)
    assert output_mismatch(torch.ones(4), expected, 1e-4, 1e-4) is None
    assert "shape" in (output_mismatch(torch.ones(5), expected, 1e-4, 1e-4) or "")
    assert "NaN" in (output_mismatch(torch.tensor([1.0, float("nan"), 1.0, 1.0]), expected, 1e-4, 1e-4) or "")
    wrong = output_mismatch(torch.tensor([1.0, 1.0, 2.0, 1.0]), expected, 1e-4, 1e-4)
    assert wrong is not None
    assert "1 elements off" in wrong
    assert "index 2" in wrong


# -- measurement isolation and the vendor op ---------------------------------------------------------


def _spread_ms(m: Measurement) -> float:
    return m.p90_ms - m.p10_ms


def test_what_ran_before_a_config_does_not_change_its_median_beyond_its_spread() -> None:
    """A single-core native config timed as an interleaved run times it (a settle step, one untimed
    call, then the sample), right after itself and right after torch's op on every core."""
    from tiletune.kernels.registry import get_kernel

    spec = get_kernel("native_softmax")
    shape = {"rows": 256, "cols": 1024}
    config = {"tile_rows": 16, "tile_cols": 1024, "block_dim": 1, "buffer_num": 2, "pipeline_depth": 2}
    device = CpuDevice()
    x = spec.make_inputs(shape, "float32", device.torch_device)
    big_a, big_b = torch.randn(1 << 22), torch.randn(1 << 22)

    def candidate() -> object:
        return spec.run(x, config, shape)

    def multi_threaded() -> object:
        return torch.add(big_a, big_b)  # torch's OpenMP team on every core

    settings = BenchSettings()
    samples: dict[str, list[float]] = {"itself": [], "torch": []}
    for _ in range(60):
        for before, name in ((candidate, "itself"), (multi_threaded, "torch")):
            time_launches_ms(before, device, 1)
            settle(settings)
            candidate()
            samples[name].append(time_launches_ms(candidate, device, 4))
    after_itself = Measurement.from_samples(samples["itself"], launches=4)
    after_torch = Measurement.from_samples(samples["torch"], launches=4)
    tolerance = max(_spread_ms(after_itself), _spread_ms(after_torch), 0.05 * after_itself.median_ms)
    assert abs(after_torch.median_ms - after_itself.median_ms) <= tolerance, (after_itself, after_torch)


def test_settle_runs_before_every_interleaved_sample() -> None:
    calls: list[float] = []
    settings = BenchSettings(warmup_runs=0, min_samples=3, max_samples=3, budget_s=0.0, settle_s=0.01)
    started = time.perf_counter()
    measure_interleaved(
        [lambda: calls.append(1.0), lambda: calls.append(2.0)], ScriptedDevice([1.0]), settings
    )
    assert len(calls) == 6
    assert time.perf_counter() - started >= 6 * 0.01


def test_compare_with_vendor_adds_the_default_and_a_vendor_row_interleaved() -> None:
    from tiletune.kernels.registry import get_kernel
    from tiletune.tuner.measure.bench import KernelBench
    from tiletune.tuner.measure.vendor_compare import compare_with_vendor

    spec = get_kernel("fused_attention")
    shape = {
        "batch": 1,
        "heads": 2,
        "kv_heads": 2,
        "seq_q": 40,
        "seq_kv": 40,
        "head_dim": 16,
        "causal": 1,
        "mask": 0,
    }
    device = CpuDevice()
    settings = BenchSettings(min_samples=5, max_samples=20, budget_s=0.01)
    bench = KernelBench(spec, shape, "float32", device, settings=settings)
    default = spec.default_config(shape, "float32", device.chip.limits)
    tuned = {"block_q": 16, "block_kv": 40, "buffer_num": 2, "pipeline_depth": 2}
    too_deep = {"block_q": 16, "block_kv": 16, "buffer_num": 1, "pipeline_depth": 3}
    rows = [row.as_dict() for row in compare_with_vendor(bench, [tuned, too_deep], default)]
    assert [r["is_vendor"] for r in rows] == [False, False, True, False]
    assert [r["is_default"] for r in rows] == [False, True, False, False]
    assert rows[0]["config"] == tuned
    assert rows[2]["config"] is None
    assert all(r["median_ms"] > 0 and r["samples"] >= 5 for r in rows[:3])
    assert rows[3]["config"] == too_deep
    assert rows[3]["median_ms"] is None
    assert "buffer_num" in rows[3]["invalid"]


# -- samples of several back-to-back launches ----------------------------------------------------------


def _spin(duration_us: float) -> Callable[[], None]:
    """A callable of known cost: it busy-waits ``duration_us`` microseconds."""

    def spin() -> None:
        end = time.perf_counter_ns() + duration_us * 1e3
        while time.perf_counter_ns() < end:
            pass

    return spin


class RecordingDevice(CpuDevice):
    """The real CPU timer, keeping the length of every timed run (all its launches together)."""

    def __init__(self) -> None:
        super().__init__()
        self.runs_ms: list[float] = []

    def time_ms(self, fn: Callable[[], object]) -> float:
        self.runs_ms.append(super().time_ms(fn))
        return self.runs_ms[-1]


def test_a_sample_of_a_tiny_callable_spans_several_launches_and_about_min_sample_ms() -> None:
    device = RecordingDevice()
    settings = BenchSettings(
        min_samples=10, max_samples=10, budget_s=10.0, target_rel_ci=0.0, min_sample_ms=2.0
    )
    m = measure(_spin(5.0), device, settings)

    assert m.launches_per_sample > 10  # 5 µs a call: hundreds of calls to fill 2 ms
    assert m.samples == 10
    samples_ms = device.runs_ms[settings.warmup_runs :]
    assert len(samples_ms) == 10
    # About min_sample_ms: the launch count comes from the fastest warm-up run, which a loaded
    # machine can slow down; a one-call sample would last 5 µs.
    assert sorted(samples_ms)[5] >= 0.5 * settings.min_sample_ms, samples_ms
    assert m.as_dict()["launches_per_sample"] == m.launches_per_sample


def test_the_time_per_launch_of_a_callable_of_known_cost_is_right() -> None:
    settings = BenchSettings(min_samples=10, max_samples=30, budget_s=0.05, min_sample_ms=1.0)
    m = measure(_spin(20.0), CpuDevice(), settings)

    assert m.launches_per_sample > 1
    assert 0.020 <= m.median_ms < 0.020 * 1.5, m  # a spin never ends early; the loop adds little


def test_interleaved_callables_share_the_fastest_ones_launch_count_up_to_a_cap() -> None:
    settings = BenchSettings(min_samples=5, max_samples=5, budget_s=0.0, min_sample_ms=1.0)
    short, long = measure_interleaved([_spin(10.0), _spin(400.0)], CpuDevice(), settings)

    assert short.launches_per_sample >= 50  # about 1 ms of 10 µs calls
    # the same count, unless a sample of 400 µs calls would last over 10 ms
    assert 10 <= long.launches_per_sample <= min(short.launches_per_sample, SAMPLE_CAP * 1.0 / 0.4 + 1)
    assert 0.010 <= short.median_ms < 0.015, short
    assert 0.400 <= long.median_ms < 0.6, long


def test_common_launches() -> None:
    settings = BenchSettings(min_sample_ms=1.0)
    assert common_launches([(100, [0.05, 0.01]), (3, [0.4])], settings) == [100, 25]
    assert common_launches([(5, [0.2]), (2, [0.6])], settings) == [5, 5]
    assert common_launches([(1, [2.0]), (1, [])], settings) == [1, 1]  # flushing, or no warm-up


def test_a_sample_stays_one_launch_without_warm_up_when_flushing_or_when_turned_off() -> None:
    base = BenchSettings(min_samples=3, max_samples=3, budget_s=0.0)
    no_warm_up = measure(_spin(5.0), CpuDevice(), BenchSettings(warmup_runs=0, min_samples=3, max_samples=3))
    flushing = measure(
        _spin(5.0), CpuDevice(), BenchSettings(flush_bytes=1 << 16, min_samples=3, max_samples=3)
    )
    off = measure_interleaved([_spin(5.0)], CpuDevice(), BenchSettings(min_sample_ms=0.0, budget_s=0.0))

    assert measure(_spin(5.0), CpuDevice(), base).launches_per_sample > 1
    assert [no_warm_up.launches_per_sample, flushing.launches_per_sample] == [1, 1]
    assert off[0].launches_per_sample == 1
