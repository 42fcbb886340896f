"""The package list, found rather than written: pyproject.toml maps each top-level folder to its
package (``[tool.setuptools] package-dir``); every folder under one that holds an ``__init__.py``
is a package named under its root's (``kernels/rms_norm`` is ``tiletune.kernels.rms_norm``). A new
kernel family, a folder of ``kernels/``, is packaged with no edit here or in pyproject.toml.
Everything else about the build is pyproject.toml's."""

import tomllib
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent
PACKAGE_DIR: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
    "package-dir"
]

setup(
    packages=[
        name
        for package, folder in PACKAGE_DIR.items()
        for name in (package, *(f"{package}.{sub}" for sub in find_packages(str(ROOT / folder))))
    ]
)
