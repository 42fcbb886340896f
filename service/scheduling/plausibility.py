"""Times no chip can reach: a worker's report the fleet refuses before it trusts it.

A time is *impossible* when the call's floating-point operations or bytes (the kernel's own
counts, :meth:`~tiletune.kernels.declaration.KernelDeclaration.flops` and ``bytes_moved``) would
need more than the chip's ceiling (:func:`tiletune.kernels.peaks.ceiling_of`: its registered kind
and cores, and the published peak of its model). A search trial or a validation result with such
a time is stored ``failed`` with the refusal as its reason (:func:`checked`): never counted as
measured, never a winner. A kernel the server does not know, or whose counts fail on the shape,
is not checked (nothing to check against).
"""

from __future__ import annotations

from typing import TypeVar

from sqlalchemy.orm import Session

from tiletune.client.wire import TrialOutcome, ValidatedConfig
from tiletune.kernels import KernelDeclaration
from tiletune.kernels.peaks import ceiling_of, fastest_possible_s
from tiletune.service.errors import InvalidInputError
from tiletune.service.models import ChipRow, JobRow
from tiletune.service.specs import lookup_kernel

#: The start of every refusal's reason.
REFUSED = "refused by the server: "

Reported = TypeVar("Reported", TrialOutcome, ValidatedConfig)


def floor_of(session: Session, job: JobRow) -> float | None:
    """:func:`fastest_possible_ms` of ``job`` on the chip it is bound to (``None``: not bound yet)."""
    chip = session.get(ChipRow, job.chip_id) if job.chip_id is not None else None
    return fastest_possible_ms(job, chip) if chip is not None else None


def checked(reported: Reported, floor_ms: float | None) -> Reported:
    """``reported`` (a search trial's outcome or a validation result) as it came, or, when its time
    is impossible, as an error whose reason is the refusal (its measurement dropped)."""
    measurement = reported.measurement
    if measurement is None or reported.error is not None:
        return reported
    reason = impossible(measurement.median_ms, floor_ms)
    if reason is None:
        return reported
    return reported.model_copy(update={"measurement": None, "error": reason})


def fastest_possible_ms(job: JobRow, chip: ChipRow) -> float | None:
    """The least time one call of ``job``'s key can take on ``chip``, in ms; ``None`` when unknown."""
    spec = _declaration(job.kernel)
    if spec is None:
        return None
    try:
        flops = float(spec.flops(job.shape))
        moved = float(spec.bytes_moved(job.shape, job.dtype))
    except Exception:  # a plugin's count that fails on a shape: nothing to check against
        return None
    ceiling = ceiling_of(chip.name, chip.kind, chip.cores, job.dtype)
    return fastest_possible_s(flops, moved, ceiling) * 1000.0


def impossible(median_ms: float, floor_ms: float | None) -> str | None:
    """Why ``median_ms`` cannot be a measurement on the chip whose floor is ``floor_ms``, else ``None``."""
    if floor_ms is None or median_ms >= floor_ms:
        return None
    return (
        f"{REFUSED}{median_ms:.3g} ms is faster than this chip can run the call "
        f"(at least {floor_ms:.3g} ms at its peak rates)"
    )


def _declaration(kernel: str) -> KernelDeclaration | None:
    try:
        return lookup_kernel(kernel)
    except InvalidInputError:  # a kernel this server has not installed
        return None
