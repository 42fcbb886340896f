"""Building and loading the native extension: never compiled on import, absent is a reason, not a crash."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tiletune.kernels.native.build import CACHE_ENV, ERROR_FILE, build_key

PROBE = """
import json, sys
from tiletune.kernels.errors import DeviceUnavailableError
from tiletune.kernels.registry import all_kernels
from tiletune.kernels.native.build import native_status
kernels = all_kernels()
spec = kernels["native_add"]
try:
    spec.run((__import__("torch").ones(4),) * 2, {"tile_size": 4, "block_dim": 1, "buffer_num": 1,
             "pipeline_depth": 1}, {"n": 4})
    raised = ""
except DeviceUnavailableError as error:
    raised = str(error)
print(json.dumps({"status": native_status().reason, "supports": spec.supports("cpu"),
                  "add_backends": list(kernels["add"].backends()), "raised": raised}))
"""


def probe(cache: Path, **env: str) -> dict[str, object]:
    environment = {**os.environ, CACHE_ENV: str(cache), **env}
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        env=environment,
        check=True,
        timeout=120,
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_an_unbuilt_extension_is_reported_unavailable_and_importing_compiles_nothing(tmp_path: Path) -> None:
    seen = probe(tmp_path)
    assert "not built" in str(seen["status"])
    assert "make setup" in str(seen["status"])
    assert seen["supports"] is False
    assert seen["add_backends"] == ["torch"]  # workers do not offer it
    assert "native_add" in str(seen["raised"])
    assert "not built" in str(seen["raised"])
    assert list(tmp_path.iterdir()) == []  # nothing was compiled or written


def test_a_machine_without_a_compiler_says_so(tmp_path: Path) -> None:
    seen = probe(tmp_path, PATH=str(tmp_path / "empty"), CXX="no-such-compiler")
    assert "no C++ compiler" in str(seen["status"])
    assert seen["supports"] is False


def test_a_failed_build_reports_the_compilers_reason(tmp_path: Path) -> None:
    key_dir = tmp_path / build_key()
    key_dir.mkdir()
    (key_dir / ERROR_FILE).write_text("RuntimeError: add.cpp:12: error: expected ';'\n")
    seen = probe(tmp_path)
    assert "failed to build" in str(seen["status"])
    assert "expected ';'" in str(seen["status"])
    assert "failed to build" in str(seen["raised"])


def test_the_build_key_changes_with_the_sources(tmp_path: Path) -> None:
    code = (
        "import tiletune.kernels.native.build as b, pathlib, shutil, sys\n"
        "src = pathlib.Path(sys.argv[1]); shutil.copytree(b.SOURCE_DIR, src)\n"
        "before = b.build_key(); b.build_key.cache_clear(); b.SOURCE_DIR = src\n"
        "(src / 'add.cpp').write_text((src / 'add.cpp').read_text() + '// changed\\n')\n"
        "print(before != b.build_key())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "csrc")], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "True"
