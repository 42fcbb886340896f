"""What several pages show alike: the kernel a path names, a job's chip, throughput, short numbers.

The one module pages share helpers through: a page module imports from here, from
:mod:`.render` (templates, number formats, figures), :mod:`.tables` (tables and downloads)
and :mod:`.session` (the viewer), never from another page. Queries over best configs are the
service's read side (:mod:`tiletune.service.best_configs`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from sqlalchemy import func

from tiletune.kernels import KernelDeclaration, all_declarations
from tiletune.kernels.peaks import peak_fraction, peak_of
from tiletune.service.errors import NotFoundError
from tiletune.service.models import ChipRow, JobRow

#: A job's chip: the one it is bound to, else its target (a chip name or ``*``).
job_chip = func.coalesce(ChipRow.name, JobRow.chip_target).label("chip")


def kernel_spec(name: str) -> KernelDeclaration:
    """The registered kernel ``name`` (replay kernels too, when enabled); 404 naming ``kernel`` otherwise."""
    spec = all_declarations().get(name)
    if spec is None:
        raise NotFoundError(f"no kernel {name!r} is registered here", field="kernel")
    return spec


def short_fingerprint(text: str | None) -> str | None:
    """A software fingerprint (canonical JSON) in short: ``torch 2.5.1 · triton 3.1.0 · python 3.12.3``."""
    if not text:
        return None
    try:
        software = json.loads(text)
    except ValueError:
        return text[:60]
    if not isinstance(software, dict):
        return text[:60]
    order = ("torch", "triton", "torch_npu", "cann", "python")
    names = [name for name in order if software.get(name)] + sorted(
        name for name in software if name not in order and software[name]
    )
    return " · ".join(f"{name} {software[name]}" for name in names) or "—"


@dataclass(frozen=True)
class Throughput:
    """What one call achieved: GFLOP/s and GB/s (``None`` where the kernel counts none), and the
    fraction of the chip's published peak on the resource that binds (``None`` where unknown)."""

    gflops: float | None
    gbps: float | None
    peak_fraction: float | None


def throughput(
    spec: KernelDeclaration, shape: dict[str, int], dtype: str, chip: str, median_ms: float
) -> Throughput:
    """The achieved rates of a best config (a kernel whose counts fail on a shape counts none)."""
    if median_ms <= 0:
        return Throughput(None, None, None)
    seconds = median_ms / 1000.0
    try:
        flops = spec.flops(shape) / seconds
        moved = spec.bytes_moved(shape, dtype) / seconds
    except Exception:  # a plugin's count that fails on an old shape: no rate, never a 500
        return Throughput(None, None, None)
    flops_per_s = flops if flops > 0 else None
    bytes_per_s = moved if moved > 0 else None
    fraction = peak_fraction(peak_of(chip, dtype), flops_per_s, bytes_per_s)
    return Throughput(
        readable(flops_per_s / 1e9) if flops_per_s is not None else None,
        readable(bytes_per_s / 1e9) if bytes_per_s is not None else None,
        readable(fraction) if fraction is not None else None,
    )


def readable(value: float) -> float | int:
    """``value`` to three significant digits, as a whole number from 100 up (so tables show ``12,346``,
    never ``1.23e+04``); a measured time is not more precise than that."""
    if value >= 100:
        return round(value)
    return float(f"{value:.3g}")
