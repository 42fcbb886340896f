"""The replay device: recorded spaces load fast, mean what the README says, and fail clearly."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import optuna
import pytest

from tiletune.kernels.replay.recorded import (
    NOT_RECORDED,
    REPLAY_DIR_ENV,
    RecordedFailureError,
    ReplayError,
    default_replay_dir,
    replay_spaces,
)
from tiletune.tuner.measure.replay import load_replay
from tiletune.tuner.search.search import Search

optuna.logging.set_verbosity(optuna.logging.WARNING)


def pnpoly_path() -> Path:
    """The recorded pnpoly space bundled with the tests (present in every clone)."""
    return Path(__file__).parents[1] / "data" / "replay" / "pnpoly_RTX_3090.json.gz"


def write_cache(path: Path, document: Any) -> Path:
    with gzip.open(path, "wt", encoding="utf-8") as stream:
        json.dump(document, stream)
    return path


def tiny_cache() -> dict[str, Any]:
    """A Kernel Tuner cache over a 2 x 3 product: one config absent (invalid), one failed."""
    params = {"block": [32, 64], "tile": [1, 2, 4]}
    cache = {}
    for block in params["block"]:
        for tile in params["tile"]:
            if (block, tile) == (64, 4):
                continue  # rejected by the constraints: not in the cache
            time: float | str = 10.0 / tile + block / 64
            if (block, tile) == (32, 4):
                time = "RuntimeFailedConfig"
            cache[f"{block},{tile}"] = {"block": block, "tile": tile, "time": time, "times": [1.0]}
    return {
        "device_name": "Tiny GPU",
        "kernel_name": "tiny",
        "problem_size": [1],
        "tune_params_keys": ["block", "tile"],
        "tune_params": params,
        "objective": "time",
        "cache": cache,
    }


def test_pnpoly_counts_match_the_recording() -> None:
    space = load_replay(pnpoly_path())
    assert space.name == "pnpoly_RTX_3090"
    assert space.device_name == "NVIDIA GeForce RTX 3090"
    assert space.product_size == 4092
    assert space.valid_count == 4092  # every config of the product was recorded: no invalid region
    assert space.failed_count == 330  # RuntimeFailedConfig entries; 3,762 ran
    assert space.optimum_ms == pytest.approx(7.224192)
    assert space.time_ms(space.optimum_config) == space.optimum_ms
    assert all(isinstance(value, int) for values in space.knobs.values() for value in values)


def test_pnpoly_failures_are_measured_failures() -> None:
    space = load_replay(pnpoly_path())
    failed = next(key for key, time in space.entries.items() if isinstance(time, str))
    config = dict(zip(space.knobs, failed, strict=True))
    assert space.invalid_reason(config) is None
    outcome = space.measure(config)
    assert (outcome.time_ms, outcome.error) == (None, "RuntimeFailedConfig")
    with pytest.raises(RecordedFailureError, match="RuntimeFailedConfig"):
        space.time_ms(config)


def test_loading_is_cached_per_process() -> None:
    path = pnpoly_path()
    assert load_replay(path) is load_replay(path)


def test_tpe_on_pnpoly_gets_close_to_the_optimum_in_two_percent() -> None:
    space = load_replay(pnpoly_path())
    search = Search(space.search_space(), seed=0, max_trials=space.valid_count // 50)
    while not search.done:
        for candidate in search.ask(2):
            outcome = space.measure(candidate.config)
            search.tell(candidate.trial_id, outcome.time_ms, outcome.error)
    assert space.optimum_ms / search.best(1)[0][1] >= 0.9


def test_absent_configs_are_the_invalid_region_and_string_times_are_failures(tmp_path: Path) -> None:
    space = load_replay(write_cache(tmp_path / "tiny_GPU.json.gz", tiny_cache()))
    assert (space.name, space.kernel_name, space.product_size, space.valid_count) == (
        "tiny_GPU",
        "tiny",
        6,
        5,
    )
    assert space.invalid_reason({"block": 64, "tile": 4}) == NOT_RECORDED
    assert space.invalid_reason({"block": 64}) is not None
    with pytest.raises(ValueError, match="not in the recorded space"):
        space.measure({"block": 64, "tile": 4})
    assert space.measure({"block": 32, "tile": 4}).error == "RuntimeFailedConfig"
    assert space.optimum_config == {"block": 32, "tile": 2}
    assert space.optimum_ms == pytest.approx(5.5)


def test_grid_over_a_replay_space_measures_exactly_the_recorded_configs(tmp_path: Path) -> None:
    space = load_replay(write_cache(tmp_path / "tiny_GPU.json.gz", tiny_cache()))
    search = Search(space.search_space(seeds=[space.median_config()]), strategy="grid")
    while not search.done:
        for candidate in search.ask(3):
            outcome = space.measure(candidate.config)
            search.tell(candidate.trial_id, outcome.time_ms, outcome.error)
    assert search.counts.as_dict() == {"completed": 4, "invalid": 0, "duplicate": 0, "failed": 1}
    assert search.best(1)[0] == (space.optimum_config, space.optimum_ms)


def test_replay_spaces_lists_the_files_of_a_directory(tmp_path: Path) -> None:
    write_cache(tmp_path / "b_GPU.json.gz", tiny_cache())
    write_cache(tmp_path / "a_GPU.json.gz", tiny_cache())
    (tmp_path / "notes.txt").write_text("not a space")
    assert list(replay_spaces(tmp_path)) == ["a_GPU", "b_GPU"]


def test_the_replay_directory_comes_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(REPLAY_DIR_ENV, str(tmp_path))
    assert default_replay_dir() == tmp_path
    assert replay_spaces() == {}
    with pytest.raises(ReplayError, match="not a directory"):
        replay_spaces(tmp_path / "missing")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"not gzip at all", "corrupt"),
        (gzip.compress(b"{not json"), "corrupt"),
        (gzip.compress(b"[1, 2]"), "not a Kernel Tuner cache"),
        (gzip.compress(json.dumps({"tune_params_keys": ["a"]}).encode()), "not a Kernel Tuner cache"),
    ],
)
def test_a_corrupt_file_is_an_error_naming_its_path(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "broken.json.gz"
    path.write_bytes(content)
    with pytest.raises(ReplayError, match=message) as error:
        load_replay(path)
    assert str(path) in str(error.value)


def test_non_integer_knob_values_are_rejected(tmp_path: Path) -> None:
    document = tiny_cache()
    document["tune_params"]["tile"] = [1, 2.5, 4]
    with pytest.raises(ReplayError, match="non-integer"):
        load_replay(write_cache(tmp_path / "floaty.json.gz", document))


def test_a_missing_file_is_an_error_naming_its_path(tmp_path: Path) -> None:
    with pytest.raises(ReplayError, match="cannot read") as error:
        load_replay(tmp_path / "absent.json.gz")
    assert "absent.json.gz" in str(error.value)
