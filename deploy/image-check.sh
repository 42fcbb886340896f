#!/usr/bin/env bash
# Build-time checks of a tiletune image: does the image hold what its processes need at run time?
#
#   deploy/image-check.sh TARGET [CHECK ...]    run TARGET's checks (all, or the CHECKs named)
#   deploy/image-check.sh --list TARGET         name TARGET's checks, one a line
#
# The Dockerfile runs it as the last step of each target (installed as tiletune-image-check), so a
# broken image fails its build; tests/deploy/test_image_checks.py runs it on this machine's venvs,
# for the checks that can run outside Docker. It uses the `python` and `tiletune` found on PATH.
# Exit status: 0 all passed, 1 a check failed, 2 bad usage.
#
# Targets and their checks:
#   server       cli, no-torch, server-imports
#   worker-cpu   cli, torch-cpu, cxx, ninja, native-build
#                (native-build: the package has the C++ sources, and they compile and load, into
#                $TILETUNE_NATIVE_DIR, a no-op when a build is there; the Dockerfile points it at a
#                folder it deletes afterwards: the kernels are built with -march=native, so the
#                worker builds them again where it starts)
#   worker-cuda  cli, torch-cuda, cc, python-headers, triton-launcher (no GPU needed: Triton
#                compiles its launcher, C against Python.h, on the node at run time)
#   worker-npu   cli, torch-cpu, torch-npu, cann-env
set -uo pipefail

declare -A CHECKS=(
    [server]="cli no-torch server-imports"
    [worker-cpu]="cli torch-cpu cxx ninja native-build"
    [worker-cuda]="cli torch-cuda cc python-headers triton-launcher"
    [worker-npu]="cli torch-cpu torch-npu cann-env"
)

usage() {
    echo "usage: image-check.sh TARGET [CHECK ...] | image-check.sh --list TARGET" >&2
    echo "targets: ${!CHECKS[*]}" >&2
    exit 2
}

# The first line a command prints (its status is the command's).
first_line() {
    local text
    text=$("$@") || return
    echo "${text%%$'\n'*}"
}

check_cli() {
    tiletune --version
}

check_no-torch() {
    # The server plans with the kernels' torch-free declarations: torch must not be installed.
    python -c "import importlib.util, sys; sys.exit('torch is installed' if importlib.util.find_spec('torch') else print('no torch'))"
}

check_server-imports() {
    python -c "import tiletune.service.app, tiletune.service.migrate; print('server packages import')"
}

check_torch-cpu() {
    python -W ignore -c "import torch; assert torch.version.cuda is None, f'a CUDA build: {torch.__version__}'; print('torch', torch.__version__)"
}

check_torch-cuda() {
    # Only the build is checked: the driver and the GPU come from the node at run time.
    python -W ignore -c "import torch; assert torch.version.cuda, f'not a CUDA build: {torch.__version__}'; print('torch', torch.__version__, 'CUDA', torch.version.cuda)"
}

check_cxx() {
    # The compiler the native build uses: $CXX, else c++, else g++ (tiletune.kernels.native.build).
    local compiler
    compiler=$(command -v "${CXX:-c++}" || command -v g++) || { echo "no C++ compiler (c++ or g++, or \$CXX)"; return 1; }
    first_line "$compiler" --version
}

check_ninja() {
    # torch.utils.cpp_extension builds with ninja: on PATH, or beside the interpreter (the lock's).
    local ninja
    ninja=$(command -v ninja || python -c "import pathlib, sys; p = pathlib.Path(sys.executable).parent / 'ninja'; print(p if p.exists() else '')")
    [[ -n "$ninja" ]] || { echo "no ninja on PATH or beside $(command -v python)"; return 1; }
    echo "ninja $("$ninja" --version) at $ninja"
}

check_native-build() {
    # The installed package carries the C++ sources, and they compile and load here (a no-op when
    # $TILETUNE_NATIVE_DIR holds the build for this torch and CPU).
    python -W ignore - <<'PY'
from tiletune.kernels.native.build import HEADERS, SOURCE_DIR, SOURCES, build, native_status

missing = [name for name in (*SOURCES, *HEADERS) if not (SOURCE_DIR / name).is_file()]
if missing:
    raise SystemExit(f"the installed package lacks the native sources {missing} in {SOURCE_DIR}")
try:
    library = build()
except RuntimeError as error:
    raise SystemExit(str(error)) from None
status = native_status()
if not status.available:
    raise SystemExit(f"built but unusable: {status.reason}")
print(f"{len(SOURCES)} sources built and loaded: {library}")
PY
}

check_cc() {
    # The C compiler Triton picks: $CC, else gcc, else clang (triton.runtime.build).
    local compiler=${CC:-}
    [[ -n "$compiler" ]] || compiler=$(command -v gcc || command -v clang) || { echo "no C compiler (gcc or clang, or \$CC)"; return 1; }
    first_line "$compiler" --version
}

check_python-headers() {
    python - <<'PY'
import sysconfig
from pathlib import Path

scheme = sysconfig.get_default_scheme()
include = Path(sysconfig.get_paths(scheme="posix_prefix" if scheme == "posix_local" else scheme)["include"])
if not (include / "Python.h").is_file():
    raise SystemExit(f"no Python.h in {include}: Triton cannot compile its launcher")
print(f"Python.h in {include}")
PY
}

check_triton-launcher() {
    # Compile and import a C extension through Triton's own build function, as its launcher is.
    python - <<'PY'
import importlib.util
import inspect
import tempfile
from pathlib import Path

from triton.runtime.build import _build

SOURCE = """
#define PY_SSIZE_T_CLEAN
#include <Python.h>
static PyObject *answer(PyObject *self, PyObject *args) { return PyLong_FromLong(42); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "tiletune_launcher_check", NULL, -1, methods};
PyMODINIT_FUNC PyInit_tiletune_launcher_check(void) { return PyModule_Create(&module); }
"""

with tempfile.TemporaryDirectory() as folder:
    source = Path(folder) / "tiletune_launcher_check.c"
    source.write_text(SOURCE)
    extra = {"ccflags": []} if "ccflags" in inspect.signature(_build).parameters else {}
    library = _build("tiletune_launcher_check", str(source), folder, [], [], [], **extra)
    spec = importlib.util.spec_from_file_location("tiletune_launcher_check", library)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.answer() == 42
print("Triton compiles and loads a C extension here")
PY
}

check_torch-npu() {
    # torch_npu X.Y.Z (or X.Y.Z.postN) runs on torch X.Y.Z only. Read from the metadata: importing
    # torch_npu needs the driver, which the node mounts at run time.
    python - <<'PY'
from importlib.metadata import PackageNotFoundError, version

try:
    torch, npu = version("torch").split("+")[0], version("torch_npu")
except PackageNotFoundError as error:
    raise SystemExit(f"{error.name} is not installed") from None
if not (npu == torch or npu.startswith(f"{torch}.")):
    raise SystemExit(f"torch_npu {npu} is not the release for torch {torch}")
print(f"torch {torch}, torch_npu {npu}")
PY
}

check_cann-env() {
    # The CANN base image sets its environment (what set_env.sh exports) in ENV.
    local home=${ASCEND_TOOLKIT_HOME:-${ASCEND_HOME_PATH:-}}
    [[ -n "$home" && -d "$home" ]] || { echo "no CANN toolkit: ASCEND_TOOLKIT_HOME/ASCEND_HOME_PATH unset or missing"; return 1; }
    echo "CANN toolkit at $home"
}

main() {
    [[ $# -ge 1 ]] || usage
    if [[ $1 == --list ]]; then
        [[ $# -eq 2 && -n "${CHECKS[$2]:-}" ]] || usage
        printf '%s\n' ${CHECKS[$2]}
        return 0
    fi
    local target=$1
    shift
    [[ -n "${CHECKS[$target]:-}" ]] || usage
    local -a wanted=("$@")
    [[ ${#wanted[@]} -gt 0 ]] || read -r -a wanted <<< "${CHECKS[$target]}"
    local name line failed=0 output
    for name in "${wanted[@]}"; do
        if [[ " ${CHECKS[$target]} " != *" $name "* ]]; then
            echo "image-check: $name is not a check of $target (its checks: ${CHECKS[$target]})" >&2
            return 2
        fi
        if output=$("check_$name" 2>&1); then
            echo "ok    $target/$name: ${output##*$'\n'}"
        else
            echo "FAIL  $target/$name:"
            while IFS= read -r line; do echo "      $line"; done <<< "$output"
            failed=1
        fi
    done
    return $failed
}

main "$@"
