"""The C++ client: header-only C++17 (``include/tiletune/``, package data) and ``tiletune-config``.

A host program (an Ascend C operator's tiling function, a torch C++ extension) includes
``<tiletune/config.hpp>`` and answers a launch key from a bundle file (the server's export or
this node's disk cache) exactly as :class:`~tiletune.client.ConfigClient` answers it from the
same file: exact, then nearest, then the caller's default. ``tiletune-config --cflags`` prints
the compiler flags that find the headers (:mod:`tiletune.client.cpp.config_tool`).

Standard library only (importing it loads nothing but this package).
"""
