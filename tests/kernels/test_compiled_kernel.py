"""Kernels whose configs are builds: the build cache (keys, hits, failures, one build per key) and
``compiled_matmul`` (a build of its C++ per tile config) against the reference.

Each build of the kernel is a real compile (about half a second with g++): the tests keep to a few.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tiletune.client.space import DeviceLimits
from tiletune.kernels import get_declaration, get_kernel
from tiletune.kernels.build_cache import (
    BuildCache,
    BuildContext,
    BuildError,
    BuildRecipe,
    BuiltPerConfig,
    trim_message,
)
from tiletune.kernels.compiled_matmul.spec import (
    SOURCE,
    CompiledMatmulSpec,
    as_operands,
    load_runtime,
    recipe,
)
from tiletune.kernels.device import CpuDevice
from tiletune.tuner.measure.bench import BenchSettings, KernelBench

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

TILES = {"tile_m": 16, "tile_n": 32, "tile_k": 16}
QUICK = BenchSettings(warmup_runs=1, min_samples=3, max_samples=5, budget_s=0.01)


@pytest.fixture(autouse=True)
def build_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "builds"
    monkeypatch.setenv("TILETUNE_BUILD_DIR", str(folder))
    return folder


def copied_recipe(tmp_path: Path, source_text: str | None = None, flags: tuple[str, ...] = ()) -> BuildRecipe:
    """The kernel's recipe on a copy of its source (edited when ``source_text``), extra ``flags``."""
    copy = tmp_path / "src" / SOURCE.name
    copy.parent.mkdir(exist_ok=True)
    copy.write_text(SOURCE.read_text() if source_text is None else source_text)
    base = recipe()
    return replace(base, sources=(copy,), flags=base.flags + flags)


def test_the_key_changes_with_the_source_the_flags_and_the_config(tmp_path: Path, build_dir: Path) -> None:
    cache = BuildCache(build_dir)
    base = copied_recipe(tmp_path)
    key = cache.key(base, TILES)
    assert cache.key(base, dict(TILES)) == key
    assert cache.key(base, {**TILES, "tile_k": 32}) != key
    assert cache.key(copied_recipe(tmp_path, flags=("-DEXTRA",)), TILES) != key
    edited = copied_recipe(tmp_path, SOURCE.read_text() + "\n// an edit\n")
    assert cache.key(edited, TILES) != key


def test_a_build_is_published_once_and_then_found_without_building(tmp_path: Path, build_dir: Path) -> None:
    cache = BuildCache(build_dir)
    built = copied_recipe(tmp_path)
    artifact = cache.get(built, TILES)
    assert artifact.is_file()
    assert (cache.stats.built, cache.stats.hits) == (1, 0)
    assert cache.get(built, TILES) == artifact
    assert (cache.stats.built, cache.stats.hits) == (1, 1)
    other = BuildCache(build_dir)  # another process's view of the same folder
    assert other.get(built, TILES) == artifact
    assert (other.stats.built, other.stats.hits) == (0, 1)
    assert other.entries(built) == [cache.key(built, TILES)]
    assert not [p for p in (build_dir / built.name).iterdir() if p.name.startswith(".build-")]


def test_threads_asking_for_one_key_together_build_it_once(tmp_path: Path, build_dir: Path) -> None:
    cache = BuildCache(build_dir)
    built = copied_recipe(tmp_path)
    paths: list[Path] = []
    threads = [threading.Thread(target=lambda: paths.append(cache.get(built, TILES))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(paths)) == 1
    assert (cache.stats.built, cache.stats.hits) == (1, 3)


def test_a_broken_source_fails_with_the_compilers_message_and_the_failure_is_kept(
    tmp_path: Path, build_dir: Path
) -> None:
    cache = BuildCache(build_dir)
    broken = copied_recipe(tmp_path, SOURCE.read_text().replace("kRows = 4;", "kRows = 4 +;"))
    with pytest.raises(BuildError, match="error:") as first:
        cache.get(broken, TILES)
    assert "compiled_matmul.cpp" in str(first.value)
    with pytest.raises(BuildError) as again:
        cache.get(broken, TILES)
    assert str(again.value) == str(first.value)
    assert (cache.stats.built, cache.stats.failed, cache.stats.hits) == (1, 1, 1)


def test_a_build_hook_builds_and_its_exception_is_the_failure(tmp_path: Path, build_dir: Path) -> None:
    source = tmp_path / "kernel.txt"
    source.write_text("tiles")

    def hook(context: BuildContext) -> None:
        if context.values["tile_m"] > 64:
            raise ValueError("tile_m too large for this toolchain")
        context.output.write_text(f"{source.read_text()} {context.values['tile_m']}")

    hooked = BuildRecipe("hooked", (source,), "kernel.bin", compiler="true", hook=hook)
    cache = BuildCache(build_dir)
    assert cache.get(hooked, {"tile_m": 32}).read_text() == "tiles 32"
    with pytest.raises(BuildError, match="ValueError: tile_m too large"):
        cache.get(hooked, {"tile_m": 128})
    with pytest.raises(ValueError, match="not both or none"):
        BuildRecipe("neither", (source,), "x", compiler="true")


def test_a_transient_failure_is_built_again_after_retry_s_and_a_refusal_is_kept(
    tmp_path: Path, build_dir: Path
) -> None:
    source = tmp_path / "kernel.txt"
    source.write_text("tiles")
    calls = {"flaky": 0, "refused": 0}

    def flaky(context: BuildContext) -> None:
        calls["flaky"] += 1
        if calls["flaky"] == 1:
            raise OSError(28, "No space left on device")
        context.output.write_text("built")

    def refused(context: BuildContext) -> None:
        calls["refused"] += 1
        raise ValueError("tile_m does not fit this toolchain")

    cache = BuildCache(build_dir)
    flaky_recipe = BuildRecipe("flaky", (source,), "kernel.bin", compiler="true", hook=flaky)
    with pytest.raises(BuildError, match="No space left") as first:
        cache.get(flaky_recipe, {"tile_m": 16})
    assert first.value.transient
    with pytest.raises(BuildError, match="No space left"):  # kept while younger than retry_s
        cache.get(flaky_recipe, {"tile_m": 16})
    assert calls["flaky"] == 1
    later = BuildCache(build_dir, retry_s=0.0)
    assert later.get(flaky_recipe, {"tile_m": 16}).read_text() == "built"
    assert (calls["flaky"], later.stats.built) == (2, 1)
    assert later.get(flaky_recipe, {"tile_m": 16}).read_text() == "built"  # a success is kept

    refused_recipe = BuildRecipe("refused", (source,), "kernel.bin", compiler="true", hook=refused)
    for _ in range(2):
        with pytest.raises(BuildError, match="ValueError") as refusal:
            later.get(refused_recipe, {"tile_m": 16})
        assert not refusal.value.transient
    assert calls["refused"] == 1  # the same inputs fail the same way: never built again

    slow = BuildRecipe("slow", (source,), "x", compiler="sleep", command=("{compiler}", "5"), timeout_s=0.2)
    with pytest.raises(BuildError, match=r"timed out after 0\.2 s") as timeout:
        later.get(slow, {})
    assert timeout.value.transient


#: A builder whose build never ends (run in a child process that the test kills).
SLOW_BUILDER = """
import sys, time
from pathlib import Path
from tiletune.kernels.build_cache import BuildCache, BuildRecipe

def hook(context):
    time.sleep(120)

recipe = BuildRecipe("slow", (Path(sys.argv[2]),), "out.bin", compiler="true", hook=hook)
BuildCache(Path(sys.argv[1])).get(recipe, {"tile_m": 16})
"""


def test_a_killed_builders_leftover_is_removed_when_a_cache_opens_unless_its_key_is_being_built(
    tmp_path: Path, build_dir: Path
) -> None:
    source = tmp_path / "kernel.txt"
    source.write_text("tiles")
    builder = subprocess.Popen([sys.executable, "-c", SLOW_BUILDER, str(build_dir), str(source)])
    folder = build_dir / "slow"
    try:
        deadline = time.monotonic() + 60
        while not list(folder.glob(".build-*")) and time.monotonic() < deadline:
            assert builder.poll() is None
            time.sleep(0.05)
        (leftover,) = folder.glob(".build-*")
        assert BuildCache(build_dir).remove_leftovers() == 0  # its builder holds the key's lock
    finally:
        builder.kill()
        builder.wait()
    held = folder / f".build-{'a' * 24}.busy"
    held.mkdir()
    unkeyed_old, unkeyed_new = folder / ".build-old", folder / ".build-new"
    unkeyed_old.mkdir()
    unkeyed_new.mkdir()
    os.utime(unkeyed_old, (time.time() - 7200, time.time() - 7200))
    with (folder / f"{'a' * 24}.lock").open("a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # a live builder of that key
        BuildCache(build_dir)
    assert not leftover.exists()
    assert not unkeyed_old.exists()
    assert held.exists()
    assert unkeyed_new.exists()
    assert not [path for path in folder.iterdir() if path.is_dir() and not path.name.startswith(".")]


def test_a_missing_compiler_is_a_build_error(tmp_path: Path, build_dir: Path) -> None:
    missing = replace(copied_recipe(tmp_path), compiler="no-such-compiler-here")
    with pytest.raises(BuildError, match="not found on PATH"):
        BuildCache(build_dir).get(missing, TILES)


def test_trimming_puts_the_error_lines_first_and_bounds_the_length() -> None:
    text = "\n".join([*(f"note: line {i}" for i in range(400)), "x.cpp:3:1: error: expected ';'"])
    trimmed = trim_message(text, limit=300)
    assert trimmed.startswith("x.cpp:3:1: error: expected ';'")
    assert len(trimmed) <= 340
    assert "more lines)" in trimmed


@pytest.mark.parametrize(
    ("dims", "config", "dtype"),
    [
        ({"m": 37, "n": 45, "k": 29}, {"tile_m": 16, "tile_n": 32, "tile_k": 16, "block_dim": 1}, "float32"),
        ({"m": 37, "n": 45, "k": 29}, {"tile_m": 16, "tile_n": 32, "tile_k": 16, "block_dim": 2}, "float16"),
        ({"m": 64, "n": 40, "k": 70}, {"tile_m": 64, "tile_n": 40, "tile_k": 64, "block_dim": 1}, "float32"),
        (
            {"m": 33, "n": 20, "k": 50, "a_transposed": 1},
            {"tile_m": 32, "tile_n": 16, "tile_k": 32, "block_dim": 2},
            "bfloat16",
        ),
    ],
)
def test_compiled_matmul_matches_the_reference_for_tiles_that_do_not_divide_the_shape(
    dims: dict[str, int], config: dict[str, int], dtype: str
) -> None:
    spec = get_kernel("compiled_matmul")
    shape = spec.parse_shape(dims)
    inputs = spec.make_inputs(shape, dtype, torch.device("cpu"))
    out = spec.run(
        inputs, spec.parse_config(config, shape, DeviceLimits(1 << 20, cores=2)), shape, "compiled"
    )
    assert isinstance(out, torch.Tensor)
    assert out.dtype == inputs[0].dtype
    tolerance = spec.tolerance(dtype)
    torch.testing.assert_close(
        out.float(), spec.reference(inputs, shape), atol=tolerance.atol, rtol=tolerance.rtol
    )


def test_configs_differing_in_run_time_knobs_share_one_build(build_dir: Path) -> None:
    spec = get_kernel("compiled_matmul")
    assert isinstance(spec, BuiltPerConfig)
    assert spec.build_knobs == ("tile_m", "tile_n", "tile_k")
    one = spec.build_config({**TILES, "block_dim": 1})
    assert spec.build_config({**TILES, "block_dim": 2}) == one
    assert len(BuildCache(build_dir).entries(recipe())) == 1


def test_the_run_time_tiles_build_computes_the_same_product(tmp_path: Path, build_dir: Path) -> None:
    call = load_runtime(BuildCache(build_dir).get(recipe(runtime_tiles=True), {}))
    spec = get_kernel("compiled_matmul")
    shape = spec.parse_shape({"m": 50, "n": 70, "k": 90})
    inputs = spec.make_inputs(shape, "float32", torch.device("cpu"))
    a, b, c = as_operands(inputs)
    assert call(a.data_ptr(), b.data_ptr(), c.data_ptr(), 50, 70, 90, 32, 64, 16, 2) == 0
    torch.testing.assert_close(c, spec.reference(inputs, shape), atol=1e-4, rtol=1e-4)


class BrokenMatmulSpec(CompiledMatmulSpec):
    """``compiled_matmul`` built from a source that does not compile (a user's typo)."""

    def __init__(self, broken: BuildRecipe) -> None:
        super().__init__()
        self.broken = broken

    def build_recipe(self) -> BuildRecipe:
        return self.broken


def test_a_config_that_does_not_build_is_a_failed_trial_with_the_compilers_message(tmp_path: Path) -> None:
    broken = copied_recipe(tmp_path, SOURCE.read_text().replace("return failed;", "return failed"))
    spec = BrokenMatmulSpec(broken)
    shape = spec.parse_shape({"m": 32, "n": 32, "k": 32})
    bench = KernelBench(spec, shape, "float32", CpuDevice(), "compiled", QUICK)
    result = bench.evaluate({**TILES, "block_dim": 1})
    assert result.measurement is None
    assert result.error is not None
    assert result.error.startswith("BuildError: ")
    assert "expected ';'" in result.error


def test_the_server_sees_the_build_time_knobs_as_knobs() -> None:
    declaration = get_declaration("compiled_matmul")
    assert [knob.name for knob in declaration.knobs] == ["tile_m", "tile_n", "tile_k", "block_dim"]
    limits = DeviceLimits(1 << 20, cores=2)
    shape = declaration.parse_shape({"m": 256, "n": 256, "k": 256})
    default = declaration.default_config(shape, "float32", limits)
    assert declaration.invalid_reason(default, shape, "float32", limits) is None
    assert declaration.build_values(default) == {k: default[k] for k in ("tile_m", "tile_n", "tile_k")}
    assert get_declaration("native_matmul").build_knobs == ()
