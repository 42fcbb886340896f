"""Every third-party package the code imports is a declared dependency (pyproject.toml).

Each module of the package's source folders (the folders of ``[tool.setuptools] package-dir``)
is parsed, not imported; every absolute import in it counts, at module level or inside a function
(the lazy imports of torch, Optuna or uvicorn too). Standard-library modules
(``sys.stdlib_module_names``) and ``tiletune`` itself are left out; each other top-level name is
mapped to the distributions that install it (``importlib.metadata.packages_distributions()``,
else the name itself, for an optional package not installed here) and must be declared:

- by ``client/`` in the base ``dependencies`` (the client's install is the base one);
- by any other folder in the base dependencies or an extra.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib.metadata import packages_distributions
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = canonicalize_name(PYPROJECT["project"]["name"])
FIRST_PARTY = "tiletune"
#: The folder whose modules may import only the base dependencies.
CLIENT_FOLDER = "client"


@dataclass(frozen=True)
class Undeclared:
    """One import whose distribution is not declared where the module may use it."""

    module: str
    name: str
    distributions: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.module}: `import {self.name}` needs {' or '.join(self.distributions)}, not declared"


def source_folders() -> list[Path]:
    """The top-level folders the package is installed from (package-dir's values)."""
    folders = {value.split("/")[0] for value in PYPROJECT["tool"]["setuptools"]["package-dir"].values()}
    return sorted(ROOT / folder for folder in folders)


def declared(extras: bool) -> frozenset[str]:
    """Canonical names of the base dependencies, with every extra's when ``extras``."""
    project = PYPROJECT["project"]
    lines: list[str] = list(project["dependencies"])
    if extras:
        lines += [line for group in project["optional-dependencies"].values() for line in group]
    names = {canonicalize_name(Requirement(line).name) for line in lines}
    return frozenset(names - {PROJECT})


def imported_names(source: str) -> set[str]:
    """Top-level names of the absolute imports anywhere in ``source``."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def third_party(names: Iterable[str]) -> set[str]:
    """``names`` without the standard library, ``__future__`` and the package itself."""
    return {n for n in names if n not in sys.stdlib_module_names and n not in {"__future__", FIRST_PARTY}}


def undeclared_imports(
    path: Path, allowed: frozenset[str], installers: Mapping[str, list[str]]
) -> list[Undeclared]:
    """The imports of the module at ``path`` that no distribution in ``allowed`` installs."""
    found = []
    for name in sorted(third_party(imported_names(path.read_text()))):
        distributions = tuple(sorted({canonicalize_name(d) for d in installers.get(name, [name])}))
        if not allowed.intersection(distributions):
            module = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
            found.append(Undeclared(str(module), name, distributions))
    return found


def test_every_third_party_import_is_declared() -> None:
    installers = packages_distributions()
    base, everything = declared(extras=False), declared(extras=True)
    folders = source_folders()
    assert {"client", "service", "kernels", "migrations"} <= {folder.name for folder in folders}
    found: list[Undeclared] = []
    modules = 0
    for folder in folders:
        allowed = base if folder.name == CLIENT_FOLDER else everything
        for path in sorted(folder.rglob("*.py")):
            modules += 1
            found += undeclared_imports(path, allowed, installers)
    assert modules > 100
    assert not found, "undeclared imports (client/: base dependencies only):\n" + "\n".join(map(str, found))


def test_the_check_names_the_module_the_import_and_the_distribution(tmp_path: Path) -> None:
    module = tmp_path / "lazy.py"
    module.write_text(
        "from __future__ import annotations\nimport json\nimport httpx\nfrom tiletune.client import wire\n"
        "def later() -> None:\n    import zmq\n    from torch import nn\n"
    )
    installers = {"zmq": ["pyzmq"], "httpx": ["httpx"], "torch": ["torch"]}
    as_client = undeclared_imports(module, declared(extras=False), installers)
    assert [(u.name, u.distributions) for u in as_client] == [("torch", ("torch",)), ("zmq", ("pyzmq",))]
    assert str(as_client[1]) == f"{module}: `import zmq` needs pyzmq, not declared"
    anywhere_else = undeclared_imports(module, declared(extras=True), installers)
    assert [u.name for u in anywhere_else] == ["zmq"]
    not_installed = undeclared_imports(module, frozenset({"httpx", "torch"}), {})
    assert [(u.name, u.distributions) for u in not_installed] == [("zmq", ("zmq",))]
