"""Replay kernels and the replay bench: recorded spaces as kernels, measured by lookup.

The specs must mean exactly what the recording says (knobs, valid region, times), the
variants must be distinct and deterministic, the bench must answer as a real bench does
(measurement, invalid, error, validation run), and all of it only when opted in.
"""

from __future__ import annotations

import gzip
import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tiletune.kernels.declarations import all_declarations
from tiletune.kernels.device import REPLAY_CHIP, ReplayDevice, get_device
from tiletune.kernels.errors import InputError
from tiletune.kernels.registry import all_kernels, get_kernel, kernels_for, runs_on
from tiletune.kernels.replay.declaration import REPLAY_KERNELS_ENV, VARIANT_SPREAD, variant_sweep
from tiletune.kernels.replay.recorded import NOT_RECORDED, REPLAY_DIR_ENV
from tiletune.kernels.replay.spec import (
    NotRunnableError,
    ReplayKernelSpec,
    registered_replay_kernels,
    replay_kernels,
)
from tiletune.service.cli.main import main
from tiletune.tuner.measure.replay_bench import ReplayBench
from tiletune.tuner.measure.result import outcome_of, validated_results
from tiletune.tuner.measure.worker import Worker, WorkerRejectedError

BUNDLED = Path(__file__).parents[1] / "data" / "replay"
PNPOLY = "replay_pnpoly_RTX_3090"
LIMITS = REPLAY_CHIP.limits


def write_cache(path: Path, document: dict[str, Any]) -> Path:
    with gzip.open(path, "wt", encoding="utf-8") as stream:
        json.dump(document, stream)
    return path


def small_cache() -> dict[str, Any]:
    """A 3 x 2 x 1 product: two configs absent (the invalid region), one recorded failure."""
    params = {"block": [16, 32, 64], "unroll": [1, 2], "fixed": [7]}
    cache: dict[str, Any] = {}
    for block, unroll in itertools.product(params["block"], params["unroll"]):
        if block == 64:
            continue
        time_ms: float | str = 1.0 + block / 16 - unroll * 0.25
        if (block, unroll) == (32, 2):
            time_ms = "RuntimeFailedConfig"
        cache[f"{block},{unroll},7"] = {"block": block, "unroll": unroll, "fixed": 7, "time": time_ms}
    return {
        "device_name": "Small GPU",
        "kernel_name": "small",
        "tune_params_keys": ["block", "unroll", "fixed"],
        "tune_params": params,
        "cache": cache,
    }


@pytest.fixture
def small(tmp_path: Path) -> ReplayKernelSpec:
    write_cache(tmp_path / "small_GPU.json.gz", small_cache())
    return replay_kernels(tmp_path)["replay_small_GPU"]


@pytest.fixture
def pnpoly() -> ReplayKernelSpec:
    return replay_kernels(BUNDLED)[PNPOLY]


@pytest.fixture
def opted_in(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``$TILETUNE_REPLAY_KERNELS`` names the bundled recordings; the registry is read afresh."""
    monkeypatch.setenv(REPLAY_KERNELS_ENV, str(BUNDLED))
    all_kernels.cache_clear()
    all_declarations.cache_clear()
    yield
    monkeypatch.delenv(REPLAY_KERNELS_ENV)
    all_kernels.cache_clear()
    all_declarations.cache_clear()


def raw(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt", encoding="utf-8") as stream:
        document: dict[str, Any] = json.load(stream)
    return document


# -- the specs ------------------------------------------------------------------------------------


def test_a_replay_spec_has_the_recordings_knobs_and_one_variant_dim(pnpoly: ReplayKernelSpec) -> None:
    document = raw(BUNDLED / "pnpoly_RTX_3090.json.gz")
    assert pnpoly.name == PNPOLY
    assert pnpoly.version == 1
    assert [dim.name for dim in pnpoly.dims] == ["variant"]
    assert [knob.name for knob in pnpoly.knobs] == document["tune_params_keys"]
    assert pnpoly.knob_values({"variant": 7}) == {
        name: tuple(document["tune_params"][name]) for name in document["tune_params_keys"]
    }
    assert pnpoly.parse_shape({"variant": 3}) == {"variant": 3}
    with pytest.raises(InputError, match="positive"):
        pnpoly.parse_shape({"variant": 0})


def test_valid_means_recorded_and_recorded_failures_fail_in_every_variant(small: ReplayKernelSpec) -> None:
    shape = {"variant": 1}
    configs = [
        dict(zip(("block", "unroll", "fixed"), c, strict=True))
        for c in itertools.product((16, 32, 64), (1, 2), (7,))
    ]
    verdicts = {(c["block"], c["unroll"]): small.invalid_reason(c, shape, "float32", LIMITS) for c in configs}
    assert verdicts == {
        (16, 1): None,
        (16, 2): None,
        (32, 1): None,
        (32, 2): None,
        (64, 1): NOT_RECORDED,
        (64, 2): NOT_RECORDED,
    }
    assert len(small.space(shape, "float32", LIMITS)) == 4
    failed = {"block": 32, "unroll": 2, "fixed": 7}
    for variant in (1, 2, 50):
        outcome = small.recorded(failed, {"variant": variant})
        assert (outcome.time_ms, outcome.error) == (None, "RuntimeFailedConfig")


def test_variant_1_is_the_recording_and_the_others_are_deterministic_perturbations(
    pnpoly: ReplayKernelSpec,
) -> None:
    document = raw(BUNDLED / "pnpoly_RTX_3090.json.gz")
    names = document["tune_params_keys"]
    measured = [entry for entry in document["cache"].values() if not isinstance(entry["time"], str)][:200]
    again = replay_kernels(BUNDLED)[PNPOLY]  # another spec of the same file agrees
    ratios = []
    for entry in measured:
        config = {name: entry[name] for name in names}
        assert pnpoly.recorded(config, {"variant": 1}).time_ms == entry["time"]
        perturbed = pnpoly.recorded(config, {"variant": 2}).time_ms
        assert perturbed is not None
        assert perturbed == again.recorded(config, {"variant": 2}).time_ms
        ratios.append(perturbed / entry["time"])
    assert all(1 - VARIANT_SPREAD <= ratio <= 1 + VARIANT_SPREAD for ratio in ratios)
    assert len(set(ratios)) == len(ratios)  # every config moves differently: the variants' optima differ


def test_the_default_is_the_recordings_median_config(pnpoly: ReplayKernelSpec) -> None:
    default = pnpoly.default_config({"variant": 5}, "float32", LIMITS)
    assert default == pnpoly.default_config({"variant": 1}, "float16", LIMITS)
    assert pnpoly.invalid_reason(default, {"variant": 5}, "float32", LIMITS) is None
    times = sorted(
        entry["time"]
        for entry in raw(BUNDLED / "pnpoly_RTX_3090.json.gz")["cache"].values()
        if not isinstance(entry["time"], str)
    )
    assert pnpoly.recorded(default, {"variant": 1}).time_ms == times[(len(times) - 1) // 2]


def test_a_replay_kernel_runs_only_on_a_replay_device_and_never_runs_code(pnpoly: ReplayKernelSpec) -> None:
    assert pnpoly.backends() == ("replay",)
    assert [kind for kind in ("cpu", "cuda", "npu", "replay") if pnpoly.supports(kind)] == ["replay"]
    assert runs_on(pnpoly, "replay")
    assert not runs_on(pnpoly, "cpu")
    assert not runs_on(get_kernel("add"), "replay")
    assert pnpoly.allocated_bytes({"variant": 1}, "float32") == 0
    for call in (
        lambda: pnpoly.make_inputs({"variant": 1}, "float32", ReplayDevice().torch_device),
        lambda: pnpoly.reference((), {"variant": 1}),
        lambda: pnpoly.run((), pnpoly.default_config({"variant": 1}, "float32", LIMITS), {"variant": 1}),
    ):
        with pytest.raises(NotRunnableError, match="recorded space"):
            call()


def test_replay_kernels_are_registered_only_when_opted_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(REPLAY_KERNELS_ENV, raising=False)
    assert registered_replay_kernels() == {}
    assert not any(name.startswith("replay_") for name in all_kernels())
    assert list(registered_replay_kernels({REPLAY_KERNELS_ENV: str(BUNDLED)})) == [PNPOLY]
    # the search benchmark's variable names recordings too, but never adds kernels
    assert registered_replay_kernels({REPLAY_DIR_ENV: str(BUNDLED)}) == {}
    with pytest.warns(UserWarning, match="not a directory"):
        assert registered_replay_kernels({REPLAY_KERNELS_ENV: str(BUNDLED / "absent")}) == {}


@pytest.mark.usefixtures("opted_in")
def test_opted_in_the_registry_offers_replay_kernels_to_replay_devices_alone() -> None:
    assert PNPOLY in all_kernels()
    assert list(kernels_for("replay")) == [PNPOLY]
    assert PNPOLY not in kernels_for("cpu")
    assert "add" in kernels_for("cpu")


def test_a_file_name_that_makes_no_kernel_name_is_skipped(tmp_path: Path) -> None:
    write_cache(tmp_path / "small_GPU.json.gz", small_cache())
    write_cache(tmp_path / "bad-name.json.gz", small_cache())
    with pytest.warns(UserWarning, match="bad-name"):
        assert list(replay_kernels(tmp_path)) == ["replay_small_GPU"]


def test_a_variant_sweep_names_one_shape_per_variant() -> None:
    sweep = variant_sweep(PNPOLY, 3, trials=25, chip=REPLAY_CHIP.name, seed=4)
    assert sweep == {
        "kernel": PNPOLY,
        "shapes": [{"variant": 1}, {"variant": 2}, {"variant": 3}],
        "trials": 25,
        "seed": 4,
        "chips": ["replay/recorded"],
    }


# -- the device and the bench ---------------------------------------------------------------------


def test_the_replay_device_is_one_chip_and_times_nothing() -> None:
    device = get_device("replay")
    assert isinstance(device, ReplayDevice)
    assert (device.kind, device.chip.name, device.trial_ms) == ("replay", "replay/recorded", 0.0)
    assert get_device("auto").kind != "replay"
    with pytest.raises(RuntimeError, match="lookup"):
        device.time_ms(lambda: None)
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(InputError) as error:
            ReplayDevice(trial_ms=bad)
        assert error.value.field == "replay_trial_ms"


def test_the_replay_bench_answers_measurement_invalid_and_error(small: ReplayKernelSpec) -> None:
    bench = ReplayBench(small, {"variant": 1}, "float32", ReplayDevice())
    good = {"block": 16, "unroll": 2, "fixed": 7}
    result = bench.evaluate(good, best_known_ms=0.001)  # far slower than the best: still not pruned
    assert result.measurement is not None
    assert (result.measurement.median_ms, result.measurement.samples, result.measurement.pruned) == (
        1.5,
        1,
        False,
    )
    assert outcome_of(5, result).measurement is not None
    invalid = bench.evaluate({"block": 64, "unroll": 1, "fixed": 7})
    assert invalid.invalid == NOT_RECORDED
    failed = bench.evaluate({"block": 32, "unroll": 2, "fixed": 7})
    assert (failed.measurement, failed.error) == (None, "RuntimeFailedConfig")
    assert outcome_of(6, failed).error == "RuntimeFailedConfig"
    with pytest.raises(NotRunnableError):
        bench.runner(good)


def test_the_validation_run_reports_the_variants_times_in_order(small: ReplayKernelSpec) -> None:
    shape = {"variant": 9}
    bench = ReplayBench(small, shape, "float32", ReplayDevice())
    configs = [
        {"block": 32, "unroll": 1, "fixed": 7},
        {"block": 32, "unroll": 2, "fixed": 7},  # a recorded failure
        {"block": 64, "unroll": 2, "fixed": 7},  # not recorded
        {"block": 16, "unroll": 1, "fixed": 7},
    ]
    results = validated_results(bench, configs)
    assert [r.config for r in results] == configs
    first, failed, invalid, last = results
    assert first.measurement is not None
    assert last.measurement is not None
    assert first.measurement.median_ms == small.recorded(configs[0], shape).time_ms
    assert last.measurement.median_ms == small.recorded(configs[3], shape).time_ms
    assert first.measurement.median_ms != 2.75  # variant 9 is not the recording
    assert failed.error == "RuntimeFailedConfig"
    assert invalid.error == NOT_RECORDED


def test_a_simulated_trial_duration_is_spent_per_measured_config(small: ReplayKernelSpec) -> None:
    bench = ReplayBench(small, {"variant": 1}, "float32", ReplayDevice(trial_ms=30))
    started = time.perf_counter()
    bench.evaluate({"block": 16, "unroll": 1, "fixed": 7})
    bench.evaluate({"block": 64, "unroll": 1, "fixed": 7})  # never run: costs nothing
    assert time.perf_counter() - started >= 0.030


def test_a_replay_bench_refuses_other_kernels_and_devices(small: ReplayKernelSpec) -> None:
    with pytest.raises(TypeError, match="replay kernel"):
        ReplayBench(get_kernel("add"), {"n": 16}, "float32", ReplayDevice())
    with pytest.raises(TypeError, match="replay device"):
        ReplayBench(small, {"variant": 1}, "float32", get_device("cpu"))


# -- the worker's side ----------------------------------------------------------------------------


@pytest.mark.usefixtures("opted_in")
def test_a_replay_worker_registers_the_replay_chip_with_the_replay_kernels_alone() -> None:
    import httpx

    with httpx.Client(base_url="http://127.0.0.1:9") as http:
        registration = Worker(http, backend="replay", name="replay-1").registration()
    assert registration.chip.name == "replay/recorded"
    assert registration.chip.kind == "replay"
    assert registration.chip.cores is None  # a replay chip's spaces read no cores
    assert registration.kernels == [PNPOLY]
    assert registration.backends == ["replay"]
    assert registration.kernel_backends == {PNPOLY: ["replay"]}
    assert registration.kernel_versions == {PNPOLY: 1}


def test_a_replay_worker_without_replay_kernels_is_refused_before_it_registers(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import httpx

    monkeypatch.delenv(REPLAY_KERNELS_ENV, raising=False)
    with (
        httpx.Client(base_url="http://127.0.0.1:9") as http,
        pytest.raises(WorkerRejectedError, match=REPLAY_KERNELS_ENV),
    ):
        Worker(http, backend="replay").registration()
    assert main(["worker", "--server", "http://127.0.0.1:9", "--backend", "replay"]) == 2
    assert REPLAY_KERNELS_ENV in capsys.readouterr().err


@pytest.mark.usefixtures("opted_in")
@pytest.mark.parametrize(("backend", "trial_ms"), [("cpu", "5"), ("replay", "-1")])
def test_a_simulated_trial_duration_needs_the_replay_backend_and_a_duration(
    capsys: pytest.CaptureFixture[str], backend: str, trial_ms: str
) -> None:
    argv = ["worker", "--server", "http://127.0.0.1:9", "--backend", backend, "--replay-trial-ms", trial_ms]
    assert main(argv) == 2
    assert "replay_trial_ms" in capsys.readouterr().err
