"""Configs against the kernel's vendor op (torch's own) in one interleaved run: ``tiletune bench``.

Every config and the vendor op's output are checked before any timing; a rejected one is a row
with its reason, never an exception.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tiletune.kernels.declaration import Config
from tiletune.kernels.vendor import vendor_op
from tiletune.tuner.measure.bench import KernelBench, measure_interleaved
from tiletune.tuner.measure.check import output_mismatch
from tiletune.tuner.measure.measurement import Measurement


@dataclass(frozen=True)
class BenchRow:
    """One row of a comparison: a config (or the vendor op: ``config`` None) and its measurement.

    ``invalid`` says why a row was not timed (a constraint, a crash, a wrong result).
    """

    config: Config | None
    measurement: Measurement | None
    is_default: bool
    is_vendor: bool
    invalid: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """``{config, median_ms, p10_ms, p90_ms, samples, is_default, is_vendor}`` (+ ``invalid``)."""
        row: dict[str, Any] = {"config": self.config}
        if self.measurement is not None:
            m = self.measurement
            row.update(median_ms=m.median_ms, p10_ms=m.p10_ms, p90_ms=m.p90_ms, samples=m.samples)
        else:
            row.update(median_ms=None, invalid=self.invalid)
        row.update(is_default=self.is_default, is_vendor=self.is_vendor)
        return row


def vendor_runner(bench: KernelBench) -> Callable[[], object] | None:
    """A no-argument callable running the kernel's vendor op (torch's own) on the bench's inputs."""
    op = vendor_op(bench.spec, bench.shape, bench.device.kind)
    if op is None:
        return None
    inputs = bench.inputs
    return lambda: op(inputs)


def compare_with_vendor(bench: KernelBench, configs: Sequence[Config], default: Config) -> list[BenchRow]:
    """Measure ``configs``, ``default`` (added when missing) and the vendor op interleaved in one run.

    Every config is checked (constraint, then output against the reference) before any
    timing; so is the vendor op's output. The rows come back in order: the timed configs
    (as given, the default last if it was added), the vendor op (``config`` None,
    ``is_vendor`` True) when the kernel has one, then the rejected configs with their reason.
    """
    candidates = [*configs] if default in configs else [*configs, default]
    verdicts = [(config, bench.check(config)) for config in candidates]
    runnable = [config for config, verdict in verdicts if verdict is None]
    fns = [bench.runner(config) for config in runnable]
    vendor = vendor_runner(bench)
    vendor_invalid: str | None = None
    if vendor is not None:
        output = vendor()
        assert isinstance(output, torch.Tensor | tuple)
        tolerance = bench.tolerance
        vendor_invalid = output_mismatch(output, bench.expected, tolerance.atol, tolerance.rtol)
        if vendor_invalid is None:
            fns.append(vendor)
    measurements = measure_interleaved(fns, bench.device, bench.settings) if fns else []
    rows = [
        BenchRow(config, m, config == default, False)
        for config, m in zip(runnable, measurements, strict=False)
    ]
    if vendor is not None:
        timed = measurements[len(runnable)] if vendor_invalid is None else None
        rows.append(BenchRow(None, timed, False, True, vendor_invalid))
    for _config, verdict in verdicts:
        if verdict is not None:
            reason = verdict.invalid or verdict.error
            rows.append(BenchRow(verdict.config, None, verdict.config == default, False, reason))
    return rows
