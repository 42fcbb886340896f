"""A user's kernel, installed as a separate package, is tuned exactly like the built-ins."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tiletune.kernels.declarations import builtin_declarations

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "gelu_plugin"


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example plugin installed (no deps) into a fresh directory, as a user would."""
    work = tmp_path_factory.mktemp("plugin")
    source = shutil.copytree(EXAMPLE, work / "src")
    return pip_install(source, work / "site")


def pip_install(source: Path, target: Path) -> Path:
    """Install the package at ``source`` (no dependencies) into ``target``, as a user would."""
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation"]
    subprocess.run([*command, "--target", str(target), str(source)], check=True)
    return target


def tiletune(plugin_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(plugin_path)}
    return subprocess.run(
        [sys.executable, "-m", "tiletune.service.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def test_plugin_kernel_is_listed_beside_the_builtins(plugin_path: Path) -> None:
    result = tiletune(plugin_path, "kernels", "--json")
    assert result.returncode == 0, result.stderr
    kernels = {k["name"]: k for k in json.loads(result.stdout)["kernels"]}
    assert kernels["gelu"]["source"].startswith("plugin")
    assert kernels["add"]["source"] == "builtin"
    assert [k["name"] for k in kernels["gelu"]["knobs"]] == ["tile_size"]


def test_plugin_kernel_tunes_and_validates_against_its_reference(plugin_path: Path) -> None:
    result = tiletune(
        plugin_path, "tune", "gelu", "--shape", "n=200000", "--dtype", "float32", "--trials", "6", "--json"
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["kernel"] == "gelu"
    assert report["trials"]["completed"] >= 1
    assert report["best"]["median_ms"] <= report["default"]["p90_ms"]
    assert report["best"]["config"]["tile_size"] in [1 << p for p in range(8, 18)] + [200000]


def test_plugin_shape_errors_name_the_dim(plugin_path: Path) -> None:
    result = tiletune(plugin_path, "tune", "gelu", "--shape", "m=10", "--dtype", "float32")
    assert result.returncode == 2
    assert "missing ['n']" in result.stderr


def test_a_broken_plugin_is_skipped_with_a_warning(tmp_path: Path) -> None:
    source = tmp_path / "broken"
    (source / "broken_kernel").mkdir(parents=True)
    (source / "broken_kernel" / "__init__.py").write_text("SPEC = 42\n")
    (source / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "broken-kernel"\nversion = "0.1"\n'
        '[project.entry-points."tiletune.kernels"]\nbroken = "broken_kernel:SPEC"\n'
        "[tool.setuptools]\npackages = ['broken_kernel']\n"
    )
    target = pip_install(source, tmp_path / "site")
    result = tiletune(target, "kernels", "--json")
    assert result.returncode == 0, result.stderr
    assert "skipping kernel plugin 'broken'" in result.stderr
    assert "not a KernelSpec" in result.stderr
    assert "add" in {k["name"] for k in json.loads(result.stdout)["kernels"]}


def test_a_server_reads_the_plugins_declaration_without_torch(plugin_path: Path) -> None:
    """The plugin's family (entry point ``tiletune.families``) and its space load where torch cannot:
    a server's."""
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from tiletune.client.space import DeviceLimits\n"
        "from tiletune.kernels.declarations import all_declarations, get_declaration\n"
        "gelu = get_declaration('gelu')\n"
        "default = gelu.default_config({'n': 100000}, 'float32', DeviceLimits(1 << 20))\n"
        "print(type(gelu).__name__, default, len(all_declarations()))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(plugin_path)}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False, timeout=60
    )

    assert result.returncode == 0, result.stderr
    # every implementation of every built-in family, then the plugin's
    declared = str(len(builtin_declarations()) + 1)
    assert result.stdout.split() == ["GeluDeclaration", "{'tile_size':", "1024}", declared]


OLD_SPEC_GROUP = '[project.entry-points."tiletune.kernels"]\ngelu = "tiletune_example_gelu.spec:SPEC"\n'
OLD_SPACE_GROUP = '[project.entry-points."tiletune.spaces"]\ngelu = "tiletune_example_gelu.space:GELU"\n'


@pytest.mark.parametrize(
    ("groups", "declared_by"),
    [((OLD_SPEC_GROUP,), "GeluSpec"), ((OLD_SPACE_GROUP, OLD_SPEC_GROUP), "GeluDeclaration")],
    ids=["spec only", "space and spec"],
)
def test_a_plugin_of_the_older_groups_still_loads(
    tmp_path: Path, groups: tuple[str, ...], declared_by: str
) -> None:
    """A plugin written before families (entry points ``tiletune.spaces`` and ``tiletune.kernels``,
    or only the latter, before spaces were declared apart) is declared and runs as before."""
    source = tmp_path / "old"
    shutil.copytree(EXAMPLE, source)
    pyproject = source / "pyproject.toml"
    text = pyproject.read_text().replace('[project.entry-points."tiletune.families"]\ngelu = ', "# ")
    pyproject.write_text(text + "\n" + "\n".join(groups))
    target = pip_install(source, tmp_path / "site")
    code = (
        "from tiletune.kernels import get_declaration, get_kernel\n"
        "print(type(get_declaration('gelu')).__name__, type(get_kernel('gelu')).__name__)"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False, timeout=60
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [declared_by, "GeluSpec"]


OPERATOR_CHECK = """
import torch
from torch.nn import functional
import tiletune
import tiletune_example_gelu.operator
from tiletune.kernels import launch

torch.manual_seed(0)  # seeded: the same inputs every run, so a tolerance miss is reproducible
x = torch.randn(3000, requires_grad=True)
y = torch.ops.tiletune.gelu(x)
torch.testing.assert_close(y, functional.gelu(x, approximate="tanh"), atol=1e-6, rtol=1e-5)
(grad,) = torch.autograd.grad(y.sum(), x)
(expected,) = torch.autograd.grad(functional.gelu(x, approximate="tanh").sum(), x)
torch.testing.assert_close(grad, expected, atol=1e-6, rtol=1e-5)
small = torch.randn(7, dtype=torch.float64, requires_grad=True)
assert torch.autograd.gradcheck(torch.ops.tiletune.gelu, (small,))
assert launch("gelu", x, client=None).grad_fn is not None
explanation = torch._dynamo.explain(lambda t: torch.ops.tiletune.gelu(t) * 2)(x)
assert (explanation.graph_count, explanation.graph_break_count) == (1, 0), explanation
print("operator ok")
"""


def test_a_plugin_kernel_becomes_an_operator_with_one_call(plugin_path: Path) -> None:
    """``register_operator``: forward and gradient as torch's, gradcheck, ``launch`` through it, one
    graph under dynamo."""
    env = {**os.environ, "PYTHONPATH": str(plugin_path)}
    result = subprocess.run(
        [sys.executable, "-c", OPERATOR_CHECK], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "operator ok"
