"""Configs against the kernel's vendor op (torch's own) in one interleaved run: ``tiletune bench``.

Every config and the vendor op's output are checked before any timing; a rejected one is a row
with its reason, never an exception.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tiletune.client.space import vendor_config
from tiletune.kernels.declaration import Config
from tiletune.kernels.vendor import vendor_op
from tiletune.tuner.measure.bench import KernelBench, measure_interleaved
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


def compare_with_vendor(bench: KernelBench, configs: Sequence[Config], default: Config) -> list[BenchRow]:
    """Measure ``configs``, ``default`` (added when missing) and the vendor op interleaved in one run.

    Every config is checked (constraint, then output against the reference) before any
    timing; so is the vendor op's output (the vendor config, :func:`KernelBench.check`). The rows come
    back in order: the timed configs (as given, the default last if it was added), the vendor op
    (``config`` None, ``is_vendor`` True) when the kernel has one here, then the rejected configs
    with their reason.
    """
    candidates = [*configs] if default in configs else [*configs, default]
    verdicts = [(config, bench.check(config)) for config in candidates]
    runnable = [config for config, verdict in verdicts if verdict is None]
    has_vendor = vendor_op(bench.spec, bench.shape, bench.device.kind) is not None
    vendor_rejected = bench.check(vendor_config()) if has_vendor else None
    timed = [*runnable, vendor_config()] if has_vendor and vendor_rejected is None else runnable
    fns = [bench.runner(config) for config in timed]
    measurements = measure_interleaved(fns, bench.device, bench.settings) if fns else []
    rows = [
        BenchRow(config, m, config == default, False)
        for config, m in zip(runnable, measurements, strict=False)
    ]
    if has_vendor:
        if vendor_rejected is None:
            rows.append(BenchRow(None, measurements[len(runnable)], False, True))
        else:
            reason = vendor_rejected.invalid or vendor_rejected.error
            rows.append(BenchRow(None, None, False, True, reason))
    for _config, verdict in verdicts:
        if verdict is not None:
            reason = verdict.invalid or verdict.error
            rows.append(BenchRow(verdict.config, None, verdict.config == default, False, reason))
    return rows
