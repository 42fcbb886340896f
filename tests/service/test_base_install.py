"""The base install (``pip install tiletune``: httpx and pydantic, no torch) runs the light commands.

The project is built as a wheel and installed into a fresh virtual environment without any
extra; its ``tiletune`` script then answers ``--help`` and ``--version`` and talks to a real
``tiletune server`` process (run from the development install) with ``submit`` and ``lookup``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tiletune.client.chip import cpu_chip_name

from .processes import ServerProcess, environment, serving_this_chip

ROOT = Path(__file__).resolve().parents[2]
#: Building the wheel and installing it with its two dependencies (from the package index).
INSTALL_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def base_install(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``tiletune`` script of a fresh venv: the project's wheel and its two dependencies only."""
    folder = tmp_path_factory.mktemp("base-install")
    wheels = folder / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            wheels,
            ROOT,
        ],
        check=True,
        timeout=INSTALL_TIMEOUT_S,
    )
    venv = folder / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    (wheel,) = wheels.glob("tiletune-*.whl")
    python = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "install", "--quiet", wheel],
        check=True,
        timeout=INSTALL_TIMEOUT_S,
    )
    return venv / "bin" / "tiletune"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with serving_this_chip(tmp_path_factory.mktemp("base-install-server")) as process:
        yield process


def run(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(script), *args], capture_output=True, text=True, env=environment(), timeout=60, check=False
    )


def test_the_base_install_has_no_torch(base_install: Path) -> None:
    python = base_install.parent / "python"
    code = "import importlib.util as u; print([m for m in ('torch', 'optuna', 'fastapi') if u.find_spec(m)])"
    result = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)

    assert result.stdout.strip() == "[]"


def test_help_and_version_work_on_the_base_install(base_install: Path) -> None:
    helped = run(base_install, "--help")
    versioned = run(base_install, "--version")
    submit_help = run(base_install, "submit", "--help")

    assert helped.returncode == 0, helped.stderr
    assert all(command in helped.stdout for command in ("tune", "worker", "submit", "lookup", "server", "up"))
    assert versioned.returncode == 0, versioned.stderr
    assert versioned.stdout.startswith("tiletune 0.")
    assert submit_help.returncode == 0
    assert "--wait" in submit_help.stdout


def test_submit_and_lookup_work_on_the_base_install(base_install: Path, server: ServerProcess) -> None:
    submitted = run(
        base_install, "submit", "--server", server.url, "--kernel", "add", "--shape", "n=4096",
        "--dtype", "float32", "--chip", "test/idle-chip", "--json",
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    sweep = json.loads(submitted.stdout)
    assert [job["shape_key"] for job in sweep["jobs"]] == ["n=4096"]

    looked_up = run(
        base_install, "lookup", "add", "--shape", "n=4096", "--dtype", "float32",
        "--server", server.url, "--json",
    )  # fmt: skip
    assert looked_up.returncode == 0, looked_up.stderr
    answer = json.loads(looked_up.stdout)
    assert (answer["match"], answer["chip"]) == ("default", cpu_chip_name())


def test_a_command_that_needs_torch_says_so_on_the_base_install(base_install: Path) -> None:
    listed = run(base_install, "kernels")
    worked = run(base_install, "worker", "--server", "http://127.0.0.1:9")

    assert listed.returncode == 1
    assert "needs torch, which is not installed here (pip install 'tiletune[tune]')" in listed.stderr
    assert worked.returncode == 1
    assert "pip install 'tiletune[worker]'" in worked.stderr
    assert "Traceback" not in listed.stderr + worked.stderr
