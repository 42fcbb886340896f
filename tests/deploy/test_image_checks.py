"""The images' build-time checks (``deploy/image-check.sh``), run here as far as they can run outside Docker.

``docker build`` cannot run here (no daemon). What each image target runs at the end of its build,
``tiletune-image-check TARGET``, is the same script; these tests run it on this machine's installs:

- ``server`` on ``.venv-server`` (the torch-free server install): every check passes; on ``.venv``
  (which has torch) its ``no-torch`` check fails;
- ``worker-cpu`` on ``.venv``: every check for real, the native build included (a no-op with the
  cache ``make setup`` filled); without a C++ compiler its ``cxx`` check fails;
- ``worker-cuda``: its compiler checks (a C compiler, ``Python.h``, a C extension compiled and
  loaded through Triton's own build function, as Triton's launcher is); without a compiler they
  fail. Its ``torch-cuda`` check needs torch's CUDA build, which is not installed here: skipped;
- ``worker-npu``: needs the CANN image and torch_npu: skipped here (that target was never built).

And what the images are made from: the wheel built from the files the Dockerfile's ``wheel`` stage
copies carries the native kernels' C++ sources and every package; each file the Dockerfile reads
exists; each target with a command runs its own checks.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.deploy.rehearsal import docker_targets, dockerfile_instructions
from tiletune.kernels.native.build import HEADERS, SOURCES

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "image-check.sh"
DOCKERFILE = ROOT / "Dockerfile"
VENV_BIN = Path(sys.executable).parent
SERVER_VENV_BIN = ROOT / ".venv-server" / "bin"


def image_check(*args: str, path: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``image-check.sh ARGS`` with ``path`` as ``PATH`` (its python and tiletune come from there)."""
    return subprocess.run(
        ["/bin/bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": path, **env},
        timeout=300,
        check=False,
    )


def with_system(bin_dir: Path) -> str:
    return f"{bin_dir}{os.pathsep}/usr/local/bin{os.pathsep}/usr/bin{os.pathsep}/bin"


def verdicts(output: str) -> dict[str, str]:
    """``{check: "ok" | "FAIL"}`` from the script's report lines."""
    return {
        match[2]: match[1] for match in re.finditer(r"^(ok|FAIL)\s+[\w-]+/([\w-]+):", output, re.MULTILINE)
    }


def test_the_server_image_checks_pass_on_the_server_install() -> None:
    done = image_check("server", path=with_system(SERVER_VENV_BIN))
    assert done.returncode == 0, done.stdout + done.stderr
    assert verdicts(done.stdout) == {"cli": "ok", "no-torch": "ok", "server-imports": "ok"}


def test_the_server_check_fails_where_torch_is_installed() -> None:
    done = image_check("server", "no-torch", path=with_system(VENV_BIN))
    assert done.returncode == 1
    assert verdicts(done.stdout) == {"no-torch": "FAIL"}
    assert "torch is installed" in done.stdout


def test_the_cpu_worker_image_checks_pass_here_native_build_included() -> None:
    done = image_check("worker-cpu", path=with_system(VENV_BIN))
    assert done.returncode == 0, done.stdout + done.stderr
    assert set(verdicts(done.stdout).values()) == {"ok"}
    assert list(verdicts(done.stdout)) == ["cli", "torch-cpu", "cxx", "ninja", "native-build"]
    assert f"{len(SOURCES)} sources built and loaded" in done.stdout


def test_a_cpu_worker_image_without_a_compiler_fails_its_check() -> None:
    done = image_check("worker-cpu", "cxx", path=str(VENV_BIN), CXX="no-such-compiler")
    assert done.returncode == 1
    assert "no C++ compiler" in done.stdout


def test_the_cuda_worker_compiler_checks_pass_here() -> None:
    done = image_check("worker-cuda", "cc", "python-headers", "triton-launcher", path=with_system(VENV_BIN))
    assert done.returncode == 0, done.stdout + done.stderr
    assert verdicts(done.stdout) == {"cc": "ok", "python-headers": "ok", "triton-launcher": "ok"}


def test_without_a_c_compiler_triton_cannot_build_its_launcher() -> None:
    missing = "/nonexistent/cc"
    done = image_check("worker-cuda", "cc", "triton-launcher", path=with_system(VENV_BIN), CC=missing)
    assert done.returncode == 1
    assert verdicts(done.stdout) == {"cc": "FAIL", "triton-launcher": "FAIL"}


def test_the_cuda_worker_torch_check() -> None:
    import torch

    if torch.version.cuda is None:
        pytest.skip(f"needs torch's CUDA build (the worker-cuda image's); here torch is {torch.__version__}")
    done = image_check("worker-cuda", "torch-cuda", path=with_system(VENV_BIN))
    assert done.returncode == 0, done.stdout


def test_the_npu_worker_checks() -> None:
    if importlib.util.find_spec("torch_npu") is None or not os.environ.get("ASCEND_TOOLKIT_HOME"):
        pytest.skip("needs the CANN base image and torch_npu: the worker-npu target is never built here")
    done = image_check("worker-npu", path=with_system(VENV_BIN))
    assert done.returncode == 0, done.stdout


def test_a_check_of_another_target_or_an_unknown_target_is_bad_usage() -> None:
    wrong_check = image_check("server", "native-build", path=with_system(VENV_BIN))
    unknown_target = image_check("worker-tpu", path=with_system(VENV_BIN))
    listed = image_check("--list", "worker-cuda", path=with_system(VENV_BIN))

    assert wrong_check.returncode == 2
    assert "not a check of server" in wrong_check.stderr
    assert unknown_target.returncode == 2
    assert "targets:" in unknown_target.stderr
    assert listed.stdout.split() == ["cli", "torch-cuda", "cc", "python-headers", "triton-launcher"]


# -- what the images are made from -------------------------------------------------------------


def stage_instructions(stage: str) -> list[tuple[str, str]]:
    """The Dockerfile's instructions from ``FROM ... AS stage`` to the next ``FROM``."""
    instructions = dockerfile_instructions(DOCKERFILE.read_text())
    start = next(
        i for i, (word, args) in enumerate(instructions) if word == "FROM" and args.endswith(f" {stage}")
    )
    following = (i for i in range(start + 1, len(instructions)) if instructions[i][0] == "FROM")
    return instructions[start + 1 : next(following, len(instructions))]


def test_every_target_with_a_command_runs_its_own_checks() -> None:
    targets = {name: target for name, target in docker_targets(DOCKERFILE).items() if name and target.cmd}
    assert set(targets) == {"server", "worker-cpu", "worker-cuda", "worker-npu"}
    for name in targets:
        runs = " ".join(args for word, args in stage_instructions(name) if word == "RUN")
        assert f"tiletune-image-check {name}" in runs, f"the {name} target never runs its image checks"


def test_every_file_the_dockerfile_reads_exists() -> None:
    text = DOCKERFILE.read_text()
    copied = re.findall(r"^COPY (?:--\S+ )*(.+) \S+$", text, re.MULTILINE)
    sources = [part for line in copied if "--from" not in line for part in line.split()]
    mounted = re.findall(r"--mount=type=bind,source=([^,\s]+),target", text)
    assert sources
    assert mounted
    for path in (*sources, *mounted):
        assert (ROOT / path).exists(), f"the Dockerfile reads {path}, which the repository lacks"


def test_the_images_wheel_carries_the_packages_and_the_native_sources(tmp_path: Path) -> None:
    """The wheel built from what the ``wheel`` stage copies: every package, and the C++ sources that a
    CPU worker compiles where it starts."""
    source = tmp_path / "src"
    for word, args in stage_instructions("wheel"):
        if word == "COPY":
            *paths, _target = args.split()
            for path in paths:
                if (ROOT / path).is_dir():
                    shutil.copytree(ROOT / path, source / path, ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    (source / path).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(ROOT / path, source / path)
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "wheels"),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (tmp_path / "wheels").glob("tiletune-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())

    for package in ("tiletune/__init__.py", "tiletune/nn/__init__.py", "tiletune/service/cli/main.py"):
        assert package in names
    missing = [name for name in (*SOURCES, *HEADERS) if f"tiletune/kernels/native/csrc/{name}" not in names]
    assert not missing, (
        f"the images' wheel lacks the native sources {missing}: pyproject's package-data must list "
        '"tiletune.kernels.native" = ["csrc/*.cpp", "csrc/*.h"]'
    )


def ignored_by_dockerignore(path: str, patterns: list[str]) -> bool:
    """Whether Docker leaves ``path`` out of the build context: the last pattern matching it or a
    folder above it decides (``!`` lets it in)."""
    ignored = False
    parents = [str(Path(*Path(path).parts[:depth])) for depth in range(1, len(Path(path).parts) + 1)]
    for pattern in patterns:
        negated, glob = pattern.startswith("!"), pattern.removeprefix("!").rstrip("/")
        if any(fnmatch.fnmatchcase(candidate, glob) for candidate in parents):
            ignored = not negated
    return ignored


def test_the_build_context_holds_every_file_the_dockerfile_reads() -> None:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    text = DOCKERFILE.read_text()
    copied = re.findall(r"^COPY (?:--\S+ )*(.+) \S+$", text, re.MULTILINE)
    sources = [part for line in copied if "--from" not in line for part in line.split()]
    mounted = re.findall(r"--mount=type=bind,source=([^,\s]+),target", text)
    read = {*sources, *mounted, "kernels/native/csrc/module.cpp", "kernels/native/csrc/native.h"}
    assert ignored_by_dockerignore(".venv/bin/python", patterns)  # the check can fail
    assert ignored_by_dockerignore(".env", patterns)
    left_out = sorted(path for path in read if ignored_by_dockerignore(path.rstrip("/"), patterns))
    assert not left_out, f".dockerignore leaves out files the Dockerfile reads: {left_out}"
