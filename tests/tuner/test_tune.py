"""Local tuning end to end: search, checks before timing, interleaved validation."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tiletune.kernels.declaration import Config, Shape, element_size
from tiletune.kernels.device import get_device
from tiletune.kernels.registry import get_kernel
from tiletune.kernels.spec import DeviceLimits, Dim, KernelSpec, Knob, torch_dtype
from tiletune.tuner.measure.bench import BenchSettings
from tiletune.tuner.measure.tune import TuneOptions, tune

FAST = BenchSettings(budget_s=0.02, max_samples=20)


class FlakyScaleSpec(KernelSpec):
    """``2 * x`` tiled; tile 512 computes a wrong answer and tile 1024 crashes (a user's buggy kernel)."""

    name = "flaky_scale"
    version = 1
    description = "2x, wrong for some tiles"
    dims = (Dim("n", "elements"),)
    knobs = (Knob("tile_size", (128, 256, 512, 1024, 2048), "elements per tile", clamp_to="n"),)

    def working_set_bytes(self, config: Config, shape: Shape, dtype: str) -> int:
        return config["tile_size"] * element_size(dtype)

    def default_config(self, shape: Shape, dtype: str, limits: DeviceLimits) -> Config:
        return {"tile_size": 128}

    def make_inputs(
        self, shape: Shape, dtype: str, device: torch.device, seed: int = 0
    ) -> tuple[torch.Tensor, ...]:
        return (torch.arange(shape["n"], dtype=torch_dtype(dtype), device=device),)

    def reference(self, inputs: Sequence[torch.Tensor], shape: Shape) -> torch.Tensor:
        return 2 * inputs[0]

    def run(
        self, inputs: Sequence[torch.Tensor], config: Config, shape: Shape, backend: str = "torch"
    ) -> torch.Tensor:
        tile = config["tile_size"]
        if tile == 1024:
            raise RuntimeError("tile 1024 overflows a register file")
        out = torch.empty_like(inputs[0])
        for start in range(0, shape["n"], tile):
            out[start : start + tile] = inputs[0][start : start + tile] * (3 if tile == 512 else 2)
        return out

    def flops(self, shape: Shape) -> float:
        return float(shape["n"])

    def bytes_moved(self, shape: Shape, dtype: str) -> float:
        return 2.0 * shape["n"] * element_size(dtype)


def test_wrong_and_crashing_configs_are_failed_trials_not_crashes() -> None:
    report = tune(
        FlakyScaleSpec(), {"n": 4096}, "float32", get_device("cpu"), TuneOptions(strategy="grid", bench=FAST)
    )
    assert report.space_size == 5
    assert report.counts["completed"] == 3
    assert report.counts["failed"] == 2
    assert report.best_config["tile_size"] in (128, 256, 2048)
    assert {c["tile_size"] for c, _ in report.validated} <= {128, 256, 2048}


def test_constraints_keep_oversized_configs_from_running() -> None:
    spec = FlakyScaleSpec()
    tiny_chip = DeviceLimits(local_memory_bytes=1024 * 4)
    assert [c["tile_size"] for c in spec.space({"n": 4096}, "float32", tiny_chip)] == [128, 256, 512, 1024]
    assert "exceeds local memory" in (
        spec.invalid_reason({"tile_size": 2048}, {"n": 4096}, "float32", tiny_chip) or ""
    )


def test_tuned_add_is_validated_interleaved_with_the_default() -> None:
    spec = get_kernel("add")
    report = tune(spec, {"n": 200_000}, "float32", get_device("cpu"), TuneOptions(trials=8, bench=FAST))
    configs = [c for c, _ in report.validated]
    assert report.default_config in configs
    assert report.best_config in configs
    samples = {m.samples for _, m in report.validated}
    assert len(samples) == 1  # one interleaved run: every finalist sampled alike
    assert report.default is not None
    assert report.best.median_ms <= report.default.median_ms
    assert report.counts["completed"] == 8
    assert report.trace[0].config == report.default_config  # the study is seeded with the default


def test_fused_attention_acceptance_command_never_loses_to_the_default() -> None:
    """The issue's acceptance check: 20 trials on the 512-token shape, best never slower than the default."""
    spec = get_kernel("fused_attention")
    shape = spec.parse_shape(
        {"batch": 1, "heads": 4, "seq_q": 512, "seq_kv": 512, "head_dim": 64, "causal": 0}
    )
    report = tune(spec, shape, "float32", get_device("cpu"), TuneOptions(trials=20))
    assert report.counts["completed"] == 20
    assert report.default is not None
    assert report.best.median_ms <= report.default.p90_ms
    assert report.default_config in [config for config, _ in report.validated]


def test_seed_configs_are_measured_right_after_the_default() -> None:
    spec = get_kernel("add")
    seed = {"tile_size": 8192, "buffer_num": 1, "pipeline_depth": 1}
    invalid = {"tile_size": 8192, "buffer_num": 1, "pipeline_depth": 2}  # depth 2 needs 2 buffers
    options = TuneOptions(strategy="grid", bench=FAST, seeds=(invalid, seed))
    report = tune(spec, {"n": 50_000}, "float32", get_device("cpu"), options)
    assert [point.config for point in report.trace[:2]] == [report.default_config, seed]
    assert report.counts["completed"] == report.space_size  # the grid still measures every valid config once
