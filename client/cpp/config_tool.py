"""``tiletune-config``: where the C++ client's headers are, for a build (``pkg-config`` style).

::

    g++ -std=c++17 $(tiletune-config --cflags) tiling.cpp     # -I<site-packages>/tiletune/client/cpp/include
    tiletune-config --include-dir                              # the folder alone (CMake, setup.py)

Contract: prints one line and exits 0; the folder printed holds ``tiletune/config.hpp``. Standard
library only: a build step imports nothing heavy.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

#: The C++ standard the headers need (at least).
CXX_STANDARD = "c++17"


def include_dir() -> Path:
    """The folder that holds ``tiletune/config.hpp`` (beside this module, the sources' folder
    through an editable install's links)."""
    return Path(__file__).resolve().parent / "include"


def cflags() -> str:
    """The flags a compiler needs to build against the headers: the include path, quoted for a shell."""
    return f"-I{shlex.quote(str(include_dir()))}"


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="tiletune-config", description=__doc__.split("\n", 1)[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--cflags", action="store_true", help="the compiler flags (-I...)")
    what.add_argument("--include-dir", action="store_true", help="the folder of tiletune/config.hpp")
    what.add_argument("--std", action="store_true", help=f"the C++ standard needed ({CXX_STANDARD})")
    args = parser.parse_args(argv)
    if args.cflags:
        print(cflags())
    elif args.include_dir:
        print(include_dir())
    else:
        print(CXX_STANDARD)
    return 0


if __name__ == "__main__":
    sys.exit(main())
