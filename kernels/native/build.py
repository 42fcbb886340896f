"""Building and loading the native CPU extension (``kernels/native/csrc``), without ever compiling on import.

The extension is built once, by ``python -m tiletune.kernels.native.build`` (``make setup``
runs it), through ``torch.utils.cpp_extension`` (ninja, the machine's C++ compiler) into a
cache directory keyed by everything the binary depends on: the sources, the compiler flags,
torch's version, the Python ABI and the CPU (it is built with ``-march=native``). The key is
part of the module's name, so a changed source or another torch is a different build.

:func:`native_status` finds and imports a finished build (never compiles, never raises): it
says whether the backend is available here and, when not, why (not built yet, the build's
recorded error, an import failure). :func:`native_module` returns the module or raises
:class:`~tiletune.kernels.errors.DeviceUnavailableError` with that reason.

Cache directory: ``$TILETUNE_NATIVE_DIR``, else ``$XDG_CACHE_HOME/tiletune/native``, else
``~/.cache/tiletune/native``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import platform
import shutil
import sys
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType

import torch

from tiletune.kernels.errors import DeviceUnavailableError

CACHE_ENV = "TILETUNE_NATIVE_DIR"
SOURCE_DIR = Path(__file__).resolve().parent / "csrc"
SOURCES = (
    "module.cpp",
    "add.cpp",
    "rows.cpp",
    "matmul.cpp",
    "attention.cpp",
    "attention_backward.cpp",
    "softmax_backward.cpp",
    "rms_norm_backward.cpp",
)
HEADERS = ("native.h",)
#: ``-fopenmp``: ATen's ``at::parallel_for`` is an inline ``#pragma omp parallel``; at run time the
#: extension shares torch's own libgomp (already loaded, same soname), so one thread pool serves all.
CFLAGS = (
    "-O3",
    "-march=native",
    "-mprefer-vector-width=512",
    "-fopenmp",
    "-fno-math-errno",
    "-fno-trapping-math",
)
ERROR_FILE = "build_error.txt"
BUILD_HINT = "run `make setup` (or `python -m tiletune.kernels.native.build`)"


@dataclass(frozen=True)
class NativeStatus:
    """Whether the native extension can run here; ``reason`` says why not (empty when it can)."""

    available: bool
    reason: str = ""


def cache_root() -> Path:
    """Where builds live (see the module docstring)."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tiletune" / "native"


def _cpu_signature() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    lines = [line for line in text.splitlines() if line.startswith(("model name", "flags"))]
    return "\n".join(sorted(set(lines)))


@cache
def build_key() -> str:
    """A digest of the sources, flags, torch, Python ABI and CPU: one build directory per key."""
    digest = hashlib.sha256()
    for name in (*SOURCES, *HEADERS):
        digest.update(name.encode())
        digest.update((SOURCE_DIR / name).read_bytes())
    for part in (*CFLAGS, torch.__version__, sys.implementation.cache_tag or "", platform.machine()):
        digest.update(part.encode())
    digest.update(_cpu_signature().encode())
    return digest.hexdigest()[:16]


def module_name() -> str:
    """The extension's module name (it carries the build key)."""
    return f"tiletune_native_{build_key()}"


def build_dir() -> Path:
    """The directory of the build for this key."""
    return cache_root() / build_key()


def _built_library() -> Path | None:
    for candidate in sorted(build_dir().glob(f"{module_name()}*.so")):
        return candidate
    return None


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")


def _import(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(module_name(), path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@cache
def _loaded() -> tuple[ModuleType | None, str]:
    library = _built_library()
    if library is None:
        error_file = build_dir() / ERROR_FILE
        if error_file.exists():
            first = error_file.read_text(errors="replace").strip().splitlines()[:3]
            return None, f"the native extension failed to build: {' / '.join(first)}"
        where = "" if _compiler() else "; no C++ compiler found (install g++ or set CXX)"
        return (
            None,
            f"the native extension is not built for this torch/CPU ({build_dir()}): {BUILD_HINT}{where}",
        )
    try:
        return _import(library), ""
    except Exception as error:  # a broken binary is a reason, never a crash
        return None, f"the native extension at {library} does not load: {type(error).__name__}: {error}"


def native_status() -> NativeStatus:
    """Whether the built extension imports here (cached; never compiles)."""
    module, reason = _loaded()
    return NativeStatus(module is not None, reason)


def native_module() -> ModuleType:
    """The extension module; raises :class:`DeviceUnavailableError` with the reason when absent."""
    module, reason = _loaded()
    if module is None:
        raise DeviceUnavailableError(f"native: {reason}")
    return module


def build(verbose: bool = False) -> Path:
    """Compile the extension into :func:`build_dir` (a no-op when built); returns the library.

    Raises ``RuntimeError`` with the compiler's reason on failure, after recording it in
    the build directory so :func:`native_status` can report it.
    """
    from torch.utils import cpp_extension

    existing = _built_library()
    if existing is not None:
        return existing
    if _compiler() is None:
        raise RuntimeError("no C++ compiler found: install g++ (or set CXX) to build the native backend")
    if shutil.which("ninja") is None:  # ninja from PyPI sits beside the interpreter
        os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    directory = build_dir()
    directory.mkdir(parents=True, exist_ok=True)
    (directory / ERROR_FILE).unlink(missing_ok=True)
    try:
        cpp_extension.load(
            name=module_name(),
            sources=[str(SOURCE_DIR / name) for name in SOURCES],
            extra_cflags=list(CFLAGS),
            extra_ldflags=["-fopenmp"],
            build_directory=str(directory),
            verbose=verbose,
        )
    except Exception as error:
        (directory / ERROR_FILE).write_text(f"{type(error).__name__}: {error}\n")
        raise RuntimeError(f"building the native extension failed: {error}") from error
    _loaded.cache_clear()
    library = _built_library()
    if library is None:
        raise RuntimeError(f"the build finished but left no library in {directory}")
    return library


def main() -> int:
    """Build (``make setup``); prints where, or the reason it failed, and exits 0 or 1."""
    started = time.monotonic()
    try:
        library = build(verbose="--verbose" in sys.argv)
    except RuntimeError as error:
        print(f"tiletune native: {error}", file=sys.stderr)
        return 1
    status = native_status()
    if not status.available:
        print(f"tiletune native: built but unusable: {status.reason}", file=sys.stderr)
        return 1
    print(f"tiletune native: {library} ({time.monotonic() - started:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
