"""tiletune.kernels: tunable kernel specs, their implementations, and devices.

Owns the kernel spec contract (``spec``), the built-in kernels (``add``,
``softmax``, ``rms_norm``, ``matmul``, ``fused_attention``), the tiled
pipeline executor their portable PyTorch implementations share (``pipeline``),
their Triton versions (``triton_*``: ``triton_spec`` holds what they share,
``triton_kernels`` the ``@triton.jit`` kernels, loaded on first run),
the kernel registry with its plugin entry points (``registry``), devices
(``device``: chip identity, limits, timers), the launch helper (``launch``:
run a kernel under the config a client gives for the call's shape), and what the
kernels hand a runtime client (``defaults``: their default rule and versions).

Imports torch; triton and torch_npu only lazily. Of tiletune.client it imports
``tiletune.client.chip`` (chip names and the software fingerprint, shared with
runtime clients so both name chips alike), ``tiletune.client.wire`` (the
vocabularies and the shape text format) and ``ClientSettings`` (for
``client_settings``); never tiletune.tuner, tiletune.service or other client
internals.
"""

from tiletune.kernels.defaults import client_settings
from tiletune.kernels.launcher import ConfigSource, Selection, launch, select_config, tiled
from tiletune.kernels.registry import all_kernels, get_kernel
from tiletune.kernels.spec import Config, DeviceLimits, Dim, KernelSpec, Knob, Shape

__all__ = [
    "Config",
    "ConfigSource",
    "DeviceLimits",
    "Dim",
    "KernelSpec",
    "Knob",
    "Selection",
    "Shape",
    "all_kernels",
    "client_settings",
    "get_kernel",
    "launch",
    "select_config",
    "tiled",
]
