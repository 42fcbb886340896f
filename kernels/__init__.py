"""tiletune.kernels: tunable kernel specs, their implementations, and devices.

Owns the kernel spec contract (``spec``), the built-in kernels (``add``,
``softmax``, ``rms_norm``, ``matmul``, ``fused_attention``), the tiled
pipeline executor their portable PyTorch implementations share (``pipeline``),
the kernel registry with its plugin entry points (``registry``), and devices
(``device``: chip identity, limits, timers).

Imports torch; triton and torch_npu only lazily. Never imports tiletune.tuner,
tiletune.service or tiletune.client internals.
"""

from tiletune.kernels.registry import all_kernels, get_kernel
from tiletune.kernels.spec import Config, DeviceLimits, Dim, KernelSpec, Knob, Shape

__all__ = ["Config", "DeviceLimits", "Dim", "KernelSpec", "Knob", "Shape", "all_kernels", "get_kernel"]
