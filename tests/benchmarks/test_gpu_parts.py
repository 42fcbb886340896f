"""The GPU check's family and fault parts, run where they can run here: in Triton's interpreter on CPU
tensors (the speed means nothing there; what is checked is that each part runs and reports)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

CODE = """
import json
import torch
from benchmarks.gpu.families import check_implementation, triton_kernels, tuned_key
from benchmarks.gpu.fault import GOOD_TILE, SPEC
from tiletune.kernels.device import CpuDevice
from tiletune.tuner.measure.bench import BenchSettings

quick = BenchSettings(warmup_runs=1, min_samples=3, max_samples=5, budget_s=0.01)
device = CpuDevice()
shape = {"rows": 8, "cols": 40}
checked = check_implementation("triton_softmax", "float16", device, quick, shape)
backward = check_implementation("triton_rms_norm_backward", "float16", device, quick, shape)
tuned = tuned_key("triton_add", device, 2, quick, {"n": 3000})
x = SPEC.make_inputs({"n": 3000}, "float32", torch.device("cpu"))
doubled = SPEC.run(x, {"tile_size": GOOD_TILE}, {"n": 3000})
print(json.dumps({
    "kernels": triton_kernels(), "checked": checked, "backward": backward, "tuned": tuned,
    "doubled": bool(torch.equal(doubled, x[0] * 2)),
}))
"""


def test_the_family_part_checks_times_and_tunes_every_triton_kernel_in_the_interpreter() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CODE)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    document = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(document["kernels"]) == 8
    assert all(kernel.startswith("triton_") for kernel in document["kernels"])
    checked = document["checked"]
    assert checked["correct"] is True
    assert set(checked["times_ms"]) == {"triton", "torch"}  # softmax has torch's op on any device
    assert checked["triton_over_torch"] > 0
    assert document["backward"]["correct"] is True
    tuned = document["tuned"]
    assert tuned["implementation"] in {"vendor", "triton"}
    assert tuned["speedup_vs_vendor"] >= 1.0  # torch's op, or a tile clearly faster than it
    assert document["doubled"] is True  # the fault kernel's good tiling is correct
