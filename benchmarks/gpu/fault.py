"""The GPU check's fault part: a trial whose Triton kernel really faults the GPU, in its own process.

``gpu_fault`` doubles a flat CUDA tensor with a Triton kernel, ``tile_size`` elements per program.
One tile size, :data:`FAULT_TILE`, stores far outside the output: a real illegal memory access,
which leaves that process's CUDA context unusable. :func:`fault_check` runs the good tiling, the
faulting one and the good one again through an isolated trial pool (what a worker runs trials in)
and says whether the fault failed that config alone, whether a fresh trial process measured the
next, and whether this process's own CUDA context still works. The spec is a module-level instance
of a module-level class, so it travels to the trial process by reference. Triton loads on first run.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

import torch

from tiletune.client.space import DeviceLimits, Dim, Knob
from tiletune.kernels.declaration import Config, Shape, element_size
from tiletune.kernels.device import Device
from tiletune.kernels.spec import KernelSpec, torch_dtype
from tiletune.tuner.measure.bench import BenchSettings
from tiletune.tuner.measure.isolation import IsolationSettings, TrialPool

FAULT_TILE = 256
GOOD_TILE = 1024
#: Elements past the end the faulting tiling stores to (4 GiB of float32 away: unmapped).
FAULT_OFFSET = 1 << 30


class GpuFaultSpec(KernelSpec):
    """``out = 2 * x`` over ``n`` elements by a Triton kernel; tile size 256 faults the GPU."""

    name = "gpu_fault"
    version = 1
    description = "doubles a CUDA tensor in Triton; tile size 256 stores out of bounds (the GPU check)"
    dims = (Dim("n", "number of elements"),)
    knobs = (Knob("tile_size", (FAULT_TILE, GOOD_TILE), "elements per program"),)

    def working_set_bytes(self, config: Config, shape: Shape, dtype: str) -> int:
        return 2 * config["tile_size"] * element_size(dtype)

    def default_config(self, shape: Shape, dtype: str, limits: DeviceLimits) -> Config:
        return {"tile_size": GOOD_TILE}

    def flops(self, shape: Shape) -> float:
        return float(shape["n"])

    def bytes_moved(self, shape: Shape, dtype: str) -> float:
        return 2.0 * shape["n"] * element_size(dtype)

    def supports(self, device_kind: str) -> bool:
        return device_kind == "cuda"

    def make_inputs(
        self, shape: Shape, dtype: str, device: torch.device, seed: int = 0
    ) -> tuple[torch.Tensor, ...]:
        generator = torch.Generator().manual_seed(seed)
        return (torch.randn(shape["n"], generator=generator).to(device=device, dtype=torch_dtype(dtype)),)

    def reference(self, inputs: Sequence[torch.Tensor], shape: Shape) -> torch.Tensor:
        return inputs[0].float() * 2

    def run(
        self, inputs: Sequence[torch.Tensor], config: Config, shape: Shape, backend: str = "torch"
    ) -> torch.Tensor:
        x = inputs[0]
        out = torch.empty_like(x)
        tile = config["tile_size"]
        kernels = importlib.import_module("benchmarks.gpu.fault_jit")  # triton loads on the first run
        kernels.double(x, out, tile, FAULT_OFFSET if tile == FAULT_TILE else 0)
        return out


SPEC = GpuFaultSpec()


def fault_check(device: Device, settings: BenchSettings) -> dict[str, Any]:
    """The good tiling, the faulting one, the good one again, in an isolated trial pool."""
    pool = TrialPool(IsolationSettings(floor_s=10.0, start_limit_s=180.0, cooldown_s=0.0))
    try:
        bench = pool.bench(SPEC, {"n": 1 << 20}, "float32", device, backend=None, settings=settings)
        before = bench.evaluate({"tile_size": GOOD_TILE})
        pid = pool.process.pid
        fault = bench.evaluate({"tile_size": FAULT_TILE})
        after = bench.evaluate({"tile_size": GOOD_TILE})
        replaced = pool.process.pid not in (None, pid)
    finally:
        pool.close()
    parent = float(torch.ones(4, device=device.torch_device).sum()) == 4.0
    document = {
        "before_ok": before.ok,
        "fault_error": fault.error,
        "after_ok": after.ok,
        "trial_process_replaced": replaced,
        "this_process_cuda_ok": parent,
    }
    document["goal_fault_fails_alone"] = (
        before.ok and fault.error is not None and after.ok and replaced and parent
    )
    return document
