"""The host tiling example (``examples/host_tiling``): an Ascend C style tiling function whose
TilingData comes from the C++ client, and a torch C++ extension built on it.

The example is compiled with the machine's g++ and run on a bundle of ``native_add`` entries
(the kernel's real info, from its declaration): a tuned shape gets its tuned tiling, a shape near
one gets the nearest's config as the Python client adapts it, an untuned one the seed's rule,
which must be what ``native_add``'s declaration gives as its default. The extension is built once
per session with ``torch.utils.cpp_extension`` (about half a minute) and adds as ``a + b`` does.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tiletune.client import ClientSettings, ConfigClient
from tiletune.client.cpp import config_tool
from tiletune.client.disk import write_bundle
from tiletune.client.space import DeviceLimits
from tiletune.client.wire import BestConfigPublic, ConfigBundle
from tiletune.kernels import get_declaration
from tiletune.kernels.info import kernel_info

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "host_tiling"
CHIP = "cpu/Host Tiling Chip/8c"
#: The platform main.cpp describes (1 MiB of local memory, 8 cores).
LIMITS = DeviceLimits(local_memory_bytes=1 << 20, cores=8)
TUNED = {"tile_size": 1024, "block_dim": 4, "buffer_num": 3, "pipeline_depth": 2}


def entry(n: int, config: dict[str, int]) -> BestConfigPublic:
    return BestConfigPublic.model_validate(
        {
            "kernel": "native_add",
            "kernel_version": get_declaration("native_add").version,
            "shape": {"n": n},
            "shape_key": f"n={n}",
            "dtype": "float32",
            "chip": CHIP,
            "config": config,
            "median_ms": 0.01,
            "promoted_at": "2025-03-01T12:00:00Z",
        }
    )


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    """A bundle of ``native_add`` tuned at n=4096 (float32) and at n=1,048,576."""
    info = kernel_info(get_declaration("native_add"), LIMITS)
    configs = [entry(4096, TUNED), entry(1 << 20, {**TUNED, "tile_size": 8192, "block_dim": 8})]
    path = tmp_path / "bundle.json"
    write_bundle(path, ConfigBundle(chip=CHIP, kernels=[info], configs=configs).sealed())
    return path


def test_the_example_compiles_and_fills_tiling_data(bundle: Path, tmp_path: Path) -> None:
    compiler = shutil.which("g++")
    assert compiler is not None, "g++ is needed"
    binary = tmp_path / "host_tiling"
    flags = ["-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", config_tool.cflags()]
    subprocess.run([compiler, *flags, str(EXAMPLE / "main.cpp"), "-o", str(binary)], check=True)
    lines = subprocess.run(
        [str(binary), str(bundle), CHIP], capture_output=True, text=True, check=True
    ).stdout
    head, *rows = lines.splitlines()
    assert head.endswith(": read")
    tilings = {(int(r.split()[0]), r.split()[1]): r.split()[2:] for r in rows}
    client = ConfigClient(None, CHIP, settings=ClientSettings(cache_dir=None))
    client.import_bundle(bundle)
    declaration = get_declaration("native_add")
    for (n, dtype), (match, total, tiles, tile, buffers, depth, block_dim) in tilings.items():
        expected = client.get("native_add", {"n": n}, dtype)
        assert match == expected.match, (n, dtype)
        config = dict(expected.config) or declaration.default_config({"n": n}, dtype, LIMITS)
        assert [int(total), int(tile), int(buffers), int(depth), int(block_dim)] == [
            n,
            config["tile_size"],
            config["buffer_num"],
            config["pipeline_depth"],
            config["block_dim"],
        ], (n, dtype, config)
        assert int(tiles) == -(-n // int(tile))
    assert tilings[(4096, "float32")][0] == "exact"
    assert tilings[(4096, "float32")][3] == "1024"
    assert tilings[(5000, "float32")][0] == "nearest"
    assert tilings[(100, "float16")][0] == "default"
    client.close()


@pytest.fixture(scope="module")
def extension(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    """The example's torch extension, built once (``examples/host_tiling/extension.py``)."""
    spec = importlib.util.spec_from_file_location("host_tiling_extension", EXAMPLE / "extension.py")
    assert spec is not None
    assert spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    built: ModuleType = script.build(tmp_path_factory.mktemp("host_tiling_build"))
    return built


def test_the_torch_extension_adds_with_the_tuned_tiling(extension: Any, bundle: Path) -> None:
    import torch

    assert extension.tiling(4096, "float32", str(bundle))[:4] == ["exact", "4096", "4", "1024"]
    assert extension.tiling(100, "float16", str(bundle))[0] == "default"  # no float16 entry
    assert extension.tiling(100, "float32", str(bundle))[0] == "nearest"
    for n in (1, 100, 4096, 5000, 1 << 20):
        a, b = torch.randn(n), torch.randn(n)
        torch.testing.assert_close(extension.tiled_add(a, b, str(bundle)), a + b)
    assert json.loads(bundle.read_text())["checksum"]  # the file the extension read is a sealed bundle
