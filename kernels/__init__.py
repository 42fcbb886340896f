"""tiletune.kernels: tunable kernels, their declarations and implementations, and devices.

Layout: one folder per kernel family, its declaration beside its implementations:

- ``add``, ``softmax``, ``rms_norm``, ``matmul``, ``fused_attention`` and their backwards: each a
  package of ``family`` (``FAMILY``: the record of its implementations, what discovery finds),
  ``declaration`` (its tuning spaces and counts, torch-free: the portable kernel's and its native
  and Triton versions'), ``portable`` (the tiled PyTorch pipeline, Ascend-C-shaped staging through
  ``pipeline``), ``native`` (C++ on CPUs), ``triton`` (the Triton kernel) and ``vendor`` (torch's
  own op, a config of the kernel like its tiles); ``compiled_matmul``: builds of a C++ kernel;
- ``family``: the family record (:class:`Family`, :class:`Implementation`) and discovery (every
  folder here with a ``family.py``, and the plugins' ``tiletune.families`` entry points);
- ``declaration``: the declaration contract (:class:`KernelDeclaration`), torch-free;
  ``declarations``: which kernels are declared (what a server plans with, never importing torch);
- ``spec``: the spec contract (:class:`KernelSpec`: a declaration plus inputs, reference, run);
  ``registry``: which kernels run here (a spec per declared name);
- ``native``: what the native kernels share (``space``: ``block_dim``, torch-free; ``spec``:
  dispatch; ``build``: building the extension from ``csrc``, never on import);
- ``triton``: what the Triton kernels share (``space``: launch knobs, torch-free; ``spec``: device
  support; ``jit``: the ``@triton.jit`` kernels, loaded on first run);
- ``replay``: recorded tuning spaces (Kernel Tuner caches) as kernels measured by lookup
  (``$TILETUNE_REPLAY_KERNELS``), for driving the service at fleet scale;
- ``pipeline``: the tiled pipeline executor the portable implementations share;
- ``vendor``: torch's own op as a config of every built-in kernel (each kernel's ``vendor``
  module: the op; ``run_config``: any config, the vendor one included; ``untuned_runs_vendor``:
  what an operator call with no measured answer runs);
- ``device``: devices: chip identity, limits, timers;
- ``conditions``: the machine's state around a measurement (governor, load, clocks), the clock
  check and the accelerators' flush default; ``device_clock``: NVML's and npu-smi's readings;
- ``launcher``: ``launch``: run a kernel under the config a client gives for the call's shape;
- ``defaults``: what the kernels hand a runtime client (``client_settings``);
- ``peaks``: chips' peak throughput; ``errors``: input errors naming the field.

Importing this package imports no torch: the declarations (and the names below that are
declarations' types) load bare, so a server without torch reads them. The names of the torch half
(``launch``, ``KernelSpec``, ``all_kernels``, …) load torch on first use. Of tiletune.client the
kernels import ``chip``, ``space``, ``wire`` and ``ClientSettings``; never tiletune.tuner,
tiletune.service or other client internals.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from tiletune.client.space import DeviceLimits, Dim, Knob
from tiletune.kernels.declaration import Config, KernelDeclaration, Shape
from tiletune.kernels.declarations import all_declarations, get_declaration

if TYPE_CHECKING:
    from tiletune.kernels.defaults import client_settings
    from tiletune.kernels.launcher import ConfigSource, Selection, launch, select_config, tiled
    from tiletune.kernels.registry import all_kernels, get_kernel
    from tiletune.kernels.spec import KernelSpec

#: The torch half's names, by the module that defines them (imported on first use).
_TORCH_HALF = {
    "client_settings": "tiletune.kernels.defaults",
    "ConfigSource": "tiletune.kernels.launcher",
    "Selection": "tiletune.kernels.launcher",
    "launch": "tiletune.kernels.launcher",
    "select_config": "tiletune.kernels.launcher",
    "tiled": "tiletune.kernels.launcher",
    "all_kernels": "tiletune.kernels.registry",
    "get_kernel": "tiletune.kernels.registry",
    "KernelSpec": "tiletune.kernels.spec",
}


def __getattr__(name: str) -> object:
    """The torch half's names, imported (with torch) on first use."""
    module = _TORCH_HALF.get(name)
    if module is None:
        raise AttributeError(f"module 'tiletune.kernels' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "Config",
    "ConfigSource",
    "DeviceLimits",
    "Dim",
    "KernelDeclaration",
    "KernelSpec",
    "Knob",
    "Selection",
    "Shape",
    "all_declarations",
    "all_kernels",
    "client_settings",
    "get_declaration",
    "get_kernel",
    "launch",
    "select_config",
    "tiled",
]
