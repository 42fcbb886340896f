"""``compiled_matmul``'s spec: a build of ``csrc/compiled_matmul.cpp`` per config, loaded with ctypes.

Each config's tiles are compiled in (``-DTILETUNE_TILE_M=…``: :data:`COMMAND`) by the machine's C++
compiler (``$CXX``, else ``g++``) with ``-O3 -march=native`` into a shared library without torch
headers (a build takes about a second, where a torch extension takes about 25), through the
process's :func:`~tiletune.kernels.build_cache.shared_cache`: built once per sources, compiler,
flags and tiles, on disk, whichever process asks first (a worker building ahead, or ``run`` itself).
A config whose build fails raises :class:`~tiletune.kernels.build_cache.BuildError` with the
compiler's message, which a bench records as the trial's error.

``run`` converts half and bfloat16 operands to float32 (the kernel computes in float32) and any
layout to row-major, then calls the build's ``tiletune_matmul`` on the tensors' data pointers with
``block_dim`` threads; the result is converted back to the operands' dtype.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from pathlib import Path

import torch

from tiletune.kernels.build_cache import BuildRecipe, build_root, shared_cache
from tiletune.kernels.compiled_matmul.declaration import COMPILED_BACKEND, CompiledMatmulDeclaration
from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.errors import DeviceUnavailableError
from tiletune.kernels.matmul.portable import MatmulSpec
from tiletune.kernels.native.spec import all_cores
from tiletune.kernels.pipeline import require_backend

SOURCE = Path(__file__).resolve().parent / "csrc" / "compiled_matmul.cpp"
#: ``-fopenmp``: ``block_dim`` threads; no ``-ffast-math``: the sums are the reference's, in order.
FLAGS = (
    "-std=c++17",
    "-O3",
    "-march=native",
    "-shared",
    "-fPIC",
    "-fopenmp",
    "-fno-math-errno",
    "-fdiagnostics-color=never",
)
#: The build of one config: the tiles as macros the kernel's template takes.
COMMAND = (
    "{compiler}",
    "{flags}",
    "-DTILETUNE_TILE_M={tile_m}",
    "-DTILETUNE_TILE_N={tile_n}",
    "-DTILETUNE_TILE_K={tile_k}",
    "{sources}",
    "-o",
    "{output}",
)
#: The same source built once with no tiles: ``tiletune_matmul_runtime`` takes them at run time.
RUNTIME_COMMAND = ("{compiler}", "{flags}", "{sources}", "-o", "{output}")
ARTIFACT = "compiled_matmul.so"

#: ``tiletune_matmul(a, b, c, m, n, k, block_dim)``: 0 done, 1 out of memory, 2 a bad argument.
MatmulCall = Callable[..., int]
_POINTERS = [ctypes.c_void_p] * 3
#: The builds loaded in this process (outside the spec, which is pickled into trial processes).
_CALLS: dict[tuple[BuildRecipe, Path, tuple[int, ...]], MatmulCall] = {}
_CALLS_LOCK = threading.Lock()


def compiler() -> str:
    """The C++ compiler builds use: ``$CXX``, else ``g++``."""
    return os.environ.get("CXX") or "g++"


def recipe(runtime_tiles: bool = False) -> BuildRecipe:
    """How a config is built (``runtime_tiles``: the one build whose tiles are run-time arguments)."""
    return BuildRecipe(
        name="compiled_matmul_runtime" if runtime_tiles else "compiled_matmul",
        sources=(SOURCE,),
        artifact=ARTIFACT,
        compiler=compiler(),
        flags=FLAGS,
        command=RUNTIME_COMMAND if runtime_tiles else COMMAND,
    )


@cache
def _library(path: Path) -> ctypes.CDLL:
    """A build loaded (once per process and path); ``OSError`` when it does not load."""
    return ctypes.CDLL(str(path))


def load_static(path: Path, tiles: Mapping[str, int]) -> MatmulCall:
    """The ``tiletune_matmul`` of the build at ``path``, checked to have been built with ``tiles``."""
    library = _library(path)
    built = (ctypes.c_int64 * 3)()
    library.tiletune_matmul_tiles(built)
    expected = [tiles["tile_m"], tiles["tile_n"], tiles["tile_k"]]
    if list(built) != expected:
        raise RuntimeError(f"the build at {path} has tiles {list(built)}, not {expected}")
    function = library.tiletune_matmul
    function.argtypes = [*_POINTERS, *[ctypes.c_int64] * 4]
    function.restype = ctypes.c_int
    call: MatmulCall = function
    return call


def load_runtime(path: Path) -> MatmulCall:
    """The ``tiletune_matmul_runtime(a, b, c, m, n, k, tile_m, tile_n, tile_k, block_dim)`` of a build."""
    function = _library(path).tiletune_matmul_runtime
    function.argtypes = [*_POINTERS, *[ctypes.c_int64] * 7]
    function.restype = ctypes.c_int
    call: MatmulCall = function
    return call


def as_operands(inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``a`` and ``b`` as the kernel reads them (CPU, row-major float32) and an empty float32 ``c``."""
    for tensor in inputs:
        if not tensor.is_cpu:
            raise ValueError(f"compiled_matmul runs on CPU tensors, got {tensor.device}")
    a, b = (t.to(torch.float32).contiguous() for t in inputs)
    return a, b, torch.empty((a.shape[0], b.shape[1]), dtype=torch.float32)


def check_status(status: int) -> None:
    """Raise for a kernel's non-zero status."""
    if status == 1:
        raise MemoryError("compiled_matmul: out of memory for its tile buffers")
    if status != 0:
        raise ValueError(f"compiled_matmul: the kernel refused its arguments (status {status})")


class CompiledMatmulSpec(CompiledMatmulDeclaration, MatmulSpec):
    """``matmul`` with compile-time tiles: inputs, reference and ``shape_of`` are ``matmul``'s."""

    def backends(self) -> tuple[str, ...]:
        """Only ``"compiled"``."""
        return (COMPILED_BACKEND,)

    def supports(self, device_kind: str) -> bool:
        """CPUs with a C++ compiler (:func:`compiler`)."""
        return device_kind == "cpu" and shutil.which(compiler()) is not None

    def unavailable_reason(self) -> str | None:
        """Why it cannot run here, or None when it can."""
        if shutil.which(compiler()) is None:
            return f"no C++ compiler {compiler()!r} on PATH (install g++ or set CXX)"
        return None

    def build_recipe(self) -> BuildRecipe:
        """How its configs are built (:func:`recipe`)."""
        return recipe()

    def build_config(self, config: Mapping[str, int]) -> Path:
        """The build of ``config``'s tiles (built now unless cached); ``BuildError`` with the compiler's
        message when it fails."""
        return shared_cache().get(self.build_recipe(), self.build_values(dict(config)))

    def kernel(self, config: Config) -> MatmulCall:
        """The loaded build of ``config``'s tiles (kept per recipe, cache root and tiles in this process,
        so a timed run never reads the cache)."""
        values = self.build_values(config)
        key = (self.build_recipe(), build_root(), tuple(values.values()))
        call = _CALLS.get(key)
        if call is None:
            if shutil.which(compiler()) is None:
                raise DeviceUnavailableError(f"{self.name}: {self.unavailable_reason()}")
            call = load_static(self.build_config(values), values)
            with _CALLS_LOCK:
                _CALLS[key] = call
        return call

    def run(
        self, inputs: Sequence[torch.Tensor], config: Config, shape: Shape, backend: str = COMPILED_BACKEND
    ) -> torch.Tensor:
        """The build of ``config``'s tiles on ``inputs`` with ``block_dim`` threads (default: all cores)."""
        require_backend(self.backends(), backend)
        if "block_dim" not in config:
            config = self.with_cores(config, shape, all_cores())
        call = self.kernel(config)
        a, b, c = as_operands(inputs)
        m, k, n = a.shape[0], a.shape[1], b.shape[1]
        check_status(call(a.data_ptr(), b.data_ptr(), c.data_ptr(), m, n, k, config["block_dim"]))
        return c if inputs[0].dtype == torch.float32 else c.to(inputs[0].dtype)


SPEC = CompiledMatmulSpec()
