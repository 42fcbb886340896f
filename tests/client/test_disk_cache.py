"""The disk cache on a hostile disk: corrupt, partly readable, unwritable, holding bad configs.

``load`` never raises and keeps what it can read; ``save`` never raises; a config on disk that
fails the check against its kernel's knobs is refused (logged once) and the default serves.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from tiletune.client import ClientSettings, ConfigClient
from tiletune.client.disk import DiskCache
from tiletune.client.wire import ConfigBundle
from tiletune.kernels import client_settings, get_kernel
from tiletune.kernels.device import get_device
from tiletune.kernels.info import kernel_info

from .conftest import CHIP
from .hostile import entry

ADD_CONFIG = {"tile_size": 4096, "buffer_num": 2, "pipeline_depth": 2}
GOOD_SHAPE, BAD_SHAPE = {"n": 4096}, {"n": 65536}


def settings(folder: Path) -> ClientSettings:
    return client_settings(cache_dir=folder, timeout_s=2.0, miss_flush_s=3600.0)


def default_of(kernel: str, shape: dict[str, int]) -> dict[str, int]:
    spec = get_kernel(kernel)
    return dict(spec.default_config(spec.parse_shape(shape), "float32", get_device("cpu").chip.limits))


def write_cache(folder: Path, document: object) -> Path:
    path = DiskCache(folder, CHIP).path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    return path


def cache_with(bad_config: Mapping[str, object], kernels: bool = True) -> dict[str, Any]:
    infos = [kernel_info(get_kernel("add")).model_dump(mode="json")] if kernels else []
    good = entry("add", GOOD_SHAPE, {**ADD_CONFIG, "tile_size": 1024})
    return {"chip": CHIP, "kernels": infos, "configs": [good, entry("add", BAD_SHAPE, bad_config)]}


@pytest.mark.parametrize(
    "content",
    [
        '{"configs": [ this is not json',
        "[1, 2, 3]",
        '{"format": "another/9", "configs": []}',
        "[" * 100_000,
        "",
    ],
    ids=["torn", "a list", "another format", "too deep", "empty"],
)
def test_a_corrupt_cache_loads_empty_and_serves_defaults(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: str
) -> None:
    write_cache(tmp_path, content)
    with caplog.at_level(logging.WARNING), ConfigClient(None, CHIP, settings=settings(tmp_path)) as client:
        answer = client.get("add", GOOD_SHAPE)
    assert (answer.match, dict(answer.config)) == ("default", default_of("add", GOOD_SHAPE))
    assert sum("unreadable config cache" in r.getMessage() for r in caplog.records) == 1


def test_a_folder_in_place_of_the_cache_file_is_no_cache(tmp_path: Path) -> None:
    DiskCache(tmp_path, CHIP).path.mkdir(parents=True)
    cache = DiskCache(tmp_path, CHIP)
    assert cache.load().configs == []
    assert cache.save(ConfigBundle.model_validate(cache_with(ADD_CONFIG))) is False


def test_an_unwritable_cache_folder_is_no_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a file"
    blocker.write_text("")
    cache = DiskCache(blocker / "cache", CHIP)  # a folder under a file: cannot be made, even by root
    assert cache.save(ConfigBundle.model_validate(cache_with(ADD_CONFIG))) is False
    assert cache.load().configs == []


def test_a_value_that_cannot_be_written_is_no_error(tmp_path: Path) -> None:
    document = cache_with(ADD_CONFIG)
    document["configs"][0]["median_ms"] = float("nan")
    bundle = ConfigBundle.model_validate(document)
    assert DiskCache(tmp_path, CHIP).save(bundle) is False  # NaN is no JSON: not written, not raised


def test_the_readable_entries_of_a_partly_corrupt_cache_are_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    document = cache_with({**ADD_CONFIG, "tile_size": -1})  # -1: no config of the wire at all
    document["configs"].append({"kernel": "add", "garbage": True})
    write_cache(tmp_path, document)
    with caplog.at_level(logging.WARNING), ConfigClient(None, CHIP, settings=settings(tmp_path)) as client:
        assert client.get("add", GOOD_SHAPE).match == "exact"
        bad = client.get("add", BAD_SHAPE)
    assert (bad.match, bad.source) == ("nearest", "disk")
    assert sum("ignoring 2 unreadable entries" in r.getMessage() for r in caplog.records) == 1


BAD_CONFIGS = {
    "zero": {**ADD_CONFIG, "tile_size": 0},
    "unknown knob": {"tile_sise": 4096, "buffer_num": 2, "pipeline_depth": 2},
    "outside the values": {**ADD_CONFIG, "tile_size": 3000},
    "over the dim": {**ADD_CONFIG, "tile_size": 131072},
}


@pytest.mark.parametrize("bad", list(BAD_CONFIGS), ids=list(BAD_CONFIGS))
def test_a_bad_config_on_disk_is_replaced_by_the_default_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, bad: str
) -> None:
    document = cache_with(BAD_CONFIGS[bad])
    document["configs"] = document["configs"][1:]  # the bad entry alone
    write_cache(tmp_path, document)
    with caplog.at_level(logging.WARNING), ConfigClient(None, CHIP, settings=settings(tmp_path)) as client:
        answers = []
        for _ in range(5):
            client.core.forget_answers()
            answers.append(client.get("add", BAD_SHAPE))
    assert {(a.match, a.source) for a in answers} == {("default", "default")}
    assert all(dict(a.config) == default_of("add", BAD_SHAPE) for a in answers)
    assert sum("refusing the config" in r.getMessage() for r in caplog.records) == 1


def test_without_the_kernels_info_a_disk_config_is_checked_for_structure(tmp_path: Path) -> None:
    write_cache(tmp_path, cache_with({**ADD_CONFIG, "tile_size": 0}, kernels=False))
    with ConfigClient(None, CHIP, settings=settings(tmp_path)) as client:
        assert client.get("add", GOOD_SHAPE).match == "exact"
        assert client.get("add", BAD_SHAPE).match == "default"  # no nearest without the kernel's dims
