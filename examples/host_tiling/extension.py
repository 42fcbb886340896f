"""Build and call the example's torch C++ extension (``add_extension.cpp``).

::

    python examples/host_tiling/extension.py BUNDLE      # prints the tilings, checks a + b

:func:`build` compiles it once with ``torch.utils.cpp_extension.load`` (ninja, the machine's
g++) into ``build_dir`` and returns the module; the tiletune headers come from
``tiletune-config``'s include folder.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent


def build(build_dir: Path) -> ModuleType:
    """The extension, compiled into ``build_dir`` unless already built there."""
    from torch.utils.cpp_extension import load

    from tiletune.client.cpp.config_tool import include_dir

    build_dir.mkdir(parents=True, exist_ok=True)
    module: ModuleType = load(
        name="host_tiling_add",
        sources=[str(HERE / "add_extension.cpp")],
        extra_include_paths=[str(include_dir()), str(HERE)],
        extra_cflags=["-O2", "-std=c++17"],
        build_directory=str(build_dir),
        verbose=False,
    )
    return module


def main(bundle: str) -> None:
    import torch

    module = build(HERE / "build")
    for n in (1000, 4096, 1 << 20):
        print(n, module.tiling(n, "float32", bundle))
    a, b = torch.randn(1 << 20), torch.randn(1 << 20)
    torch.testing.assert_close(module.tiled_add(a, b, bundle), a + b)
    print("tiled_add matches a + b")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
