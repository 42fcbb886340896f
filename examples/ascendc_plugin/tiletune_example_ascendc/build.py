"""Building one config of ``ascendc_add_tiles`` with the CANN compiler, as the Ascend C docs give it.

The hook (:func:`bisheng_build`) runs the Bisheng compiler of the CANN toolkit on the kernel with the
config's constants as macros, producing a shared library that holds the device kernel and its host
launcher (``add_tiles_do``)::

    bisheng -O2 -fPIC --shared --std=c++17 -xcce --cce-auto-sync \\
        --cce-soc-version=Ascend910B3 --cce-soc-core-type=VecCore \\
        -DTILE_LENGTH=2048 -DBUFFER_NUM=2 \\
        -I$ASCEND_HOME_PATH/compiler/tikcpp/tikcfw -I…/tikcfw/impl -I…/tikcfw/interface \\
        -I$ASCEND_HOME_PATH/include \\
        add_tiles.cpp -L$ASCEND_HOME_PATH/lib64 -lascendcl -lruntime -o libadd_tiles.so

The options are the Bisheng compiler's documented ones (CANN "Ascend C operator development guide",
"Bisheng compiler", heterogeneous compilation: ``-xcce``, ``--std=c++17`` required for Ascend C,
``--cce-soc-version=Ascend<npu-smi Name>``, ``--cce-soc-core-type=VecCore`` for vector-only code,
``--cce-auto-sync``, ``-fPIC --shared``; the compiler at ``$ASCEND_HOME_PATH/compiler/ccec_compiler/bin``).
A project built with the samples' CMake would call ``ascendc_library(… SHARED add_tiles.cpp)`` from
``$ASCEND_HOME_PATH/compiler/tikcpp/ascendc_kernel_cmake/ascendc.cmake`` instead; the include folders
above are where that file takes the Ascend C headers from. Not run here: no CANN toolkit, no NPU.

``$ASCEND_HOME_PATH`` (set by the toolkit's ``set_env.sh``) locates CANN; ``$TILETUNE_ASCEND_SOC`` names
the chip (else ``Ascend`` + the ``Name`` of ``npu-smi info``, as the docs say).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from tiletune.kernels.build_cache import BuildContext, BuildError, BuildRecipe, run_compiler

SOURCE = Path(__file__).resolve().parent / "csrc" / "add_tiles.cpp"
FLAGS = ("-O2", "-fPIC", "--shared", "--std=c++17", "-xcce", "--cce-auto-sync", "--cce-soc-core-type=VecCore")


def cann_home() -> Path:
    """The CANN toolkit (``$ASCEND_HOME_PATH``, else the default install folder)."""
    return Path(os.environ.get("ASCEND_HOME_PATH", "/usr/local/Ascend/ascend-toolkit/latest"))


def soc_version() -> str:
    """``$TILETUNE_ASCEND_SOC``, else ``Ascend`` + the chip's ``Name`` in ``npu-smi info``."""
    configured = os.environ.get("TILETUNE_ASCEND_SOC")
    if configured:
        return configured
    try:
        text = subprocess.run(
            ["npu-smi", "info"], capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError) as error:
        raise BuildError(
            f"cannot tell the chip for --cce-soc-version (set TILETUNE_ASCEND_SOC): {error}"
        ) from None
    found = re.search(r"\|\s*\d+\s+(\w+)\s+\|", text)
    if found is None:
        raise BuildError("npu-smi info names no chip: set TILETUNE_ASCEND_SOC (e.g. Ascend910B3)")
    return f"Ascend{found.group(1)}"


def bisheng_build(context: BuildContext) -> None:
    """Compile the kernel with the config's ``tile_length`` and ``buffer_num`` into ``context.output``."""
    home = cann_home()
    framework = home / "compiler" / "tikcpp" / "tikcfw"
    includes = [framework, framework / "impl", framework / "interface", home / "include"]
    args = [
        context.compiler,
        *context.recipe.flags,
        f"--cce-soc-version={soc_version()}",
        f"-DTILE_LENGTH={context.values['tile_length']}",
        f"-DBUFFER_NUM={context.values['buffer_num']}",
        *(f"-I{folder}" for folder in includes),
        *(str(source) for source in context.recipe.sources),
        f"-L{home / 'lib64'}",
        "-lascendcl",
        "-lruntime",
        "-o",
        str(context.output),
    ]
    run_compiler(args, context.workdir, context.recipe.timeout_s)


def recipe() -> BuildRecipe:
    """The build of one config: bisheng on the PATH (``set_env.sh`` puts it there) or in the toolkit."""
    in_toolkit = cann_home() / "compiler" / "ccec_compiler" / "bin" / "bisheng"
    return BuildRecipe(
        name="ascendc_add_tiles",
        sources=(SOURCE,),
        artifact="libadd_tiles.so",
        compiler=str(in_toolkit) if in_toolkit.exists() else "bisheng",
        flags=FLAGS,
        hook=bisheng_build,
    )
