"""A run pinned to one snapshot of configs (``TILETUNE_PIN``): every call of an operator launches the
snapshot's tiling, whatever a server would answer later; keys it lacks get its
nearest shape or the rule."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import torch

from tests.bundles import SOFTWARE, sealed
from tiletune.client import ConfigClient
from tiletune.kernels.device import cpu_chip
from tiletune.kernels.launcher import select_config
from tiletune.kernels.ops import configure, current_source
from tiletune.kernels.ops.source import PIN_ENV, URL_ENV

#: A config of the add kernel's space for n=4096, other than its default rule's.
PINNED = {"tile_size": 1024, "buffer_num": 3, "pipeline_depth": 2}


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    """A bundle file (as ``GET /v1/configs`` exports one) with one entry of ``add`` on this CPU."""
    entry = {
        "kernel": "add",
        "kernel_version": 1,
        "shape": {"n": 4096},
        "shape_key": "n=4096",
        "dtype": "float32",
        "chip": cpu_chip().name,
        "config": PINNED,
        "median_ms": 0.01,
        "promoted_at": datetime.now(UTC).isoformat(),
        "software": SOFTWARE,
    }
    path = tmp_path / "configs.json"
    path.write_text(json.dumps(sealed(entry)))
    return path


@pytest.fixture(autouse=True)
def unconfigured(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No URL or pin from the calling shell; the process's source reset after the test."""
    monkeypatch.delenv(URL_ENV, raising=False)
    monkeypatch.delenv(PIN_ENV, raising=False)
    yield
    configure(None)


def test_a_run_pinned_to_a_bundle_launches_its_configs_and_the_rules_elsewhere(
    bundle: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(PIN_ENV, str(bundle))
    caplog.set_level(logging.INFO, logger="tiletune.kernels.ops.source")
    source = configure()
    assert source is not None
    assert any("pinned to the 1 configs of bundle" in record.getMessage() for record in caplog.records)

    a = torch.randn(4096)
    pinned = select_config("add", a, a, client=current_source())
    assert (pinned.source, pinned.config) == ("client", PINNED)
    # a key the snapshot lacks: its nearest shape or the rule (this bundle carries no knob values
    # to adapt a config with), never a lookup of a server
    assert isinstance(source, ConfigClient)
    assert source.get("add", {"n": 5000}, dtype="float32").match in {"nearest", "default"}
    torch.testing.assert_close(torch.ops.tiletune.add(a, a), a + a)


def test_nothing_configured_is_the_rules_and_no_client() -> None:
    assert configure() is None
    assert current_source() is None
    a = torch.randn(4096)
    assert select_config("add", a, a, client=current_source()).source == "default"
