"""tiletune.kernels: tunable kernel specs, their implementations, and devices.

Modules:

- ``spec``: the kernel spec contract (dims, knobs, constraints, default rule, reference, inputs,
  flop and byte counts) every tunable kernel implements;
- ``add``, ``softmax``, ``rms_norm``, ``matmul``, ``fused_attention``: the built-in kernels and
  their portable PyTorch implementations (Ascend-C-shaped staging through ``pipeline``);
- ``pipeline``: the tiled pipeline executor the portable implementations share;
- ``native_spec`` and ``native_*``: the native CPU implementations (C++ in ``csrc``, tiles over
  ``block_dim`` cores, copy-in / compute / copy-out through ``buffer_num`` local buffers);
  ``native_build``: building the extension (``make setup``) and loading it, never on import;
- ``triton_spec``, ``triton_*``: the Triton implementations (``triton_kernels``: the
  ``@triton.jit`` kernels, loaded on first run);
- ``vendor``: each kernel's vendor op (torch's own), the bar a tuned config must clear;
- ``registry``: the built-in kernels, the plugins' entry points, the replay kernels when opted in;
- ``recorded``: recorded tuning spaces (Kernel Tuner caches), loaded once and looked up;
- ``replay_kernels``: recorded spaces as kernels measured by lookup on a replay device
  (``$TILETUNE_REPLAY_KERNELS``), for driving the service at fleet scale;
- ``device``: devices: chip identity, limits, timers;
- ``launcher``: ``launch``: run a kernel under the config a client gives for the call's shape;
- ``defaults``: what the kernels hand a runtime client (``client_settings``: their default rule
  and versions);
- ``errors``: input errors naming the field.

Imports torch; triton, torch_npu and the native extension only lazily. Of tiletune.client it
imports ``tiletune.client.chip`` (chip names and the software fingerprint, shared with runtime
clients so both name chips alike), ``tiletune.client.wire`` (the vocabularies and the shape
text format) and ``ClientSettings`` (for ``client_settings``); never tiletune.tuner,
tiletune.service or other client internals.
"""

from tiletune.client.space import Dim, Knob
from tiletune.kernels.defaults import client_settings
from tiletune.kernels.launcher import ConfigSource, Selection, launch, select_config, tiled
from tiletune.kernels.registry import all_kernels, get_kernel
from tiletune.kernels.spec import Config, DeviceLimits, KernelSpec, Shape

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
