"""What a worker tells the server about itself when it registers (``POST /v1/workers``).

:func:`registration` describes a worker of one chip running ``kernels``: the chip's name, kind
and limits (the cores its native kernels spread over, where the chip has them), every backend it
runs (``backends``), the kernels with their versions, the backends it runs of each kernel in the
kernel's order (``kernel_backends``: the server leases it jobs naming one of them, and a job
naming none runs the one it prefers: ``native`` on a CPU that has it), and its software
fingerprint.
"""

from __future__ import annotations

from collections.abc import Mapping

from tiletune.client.chip import software_fingerprint
from tiletune.client.wire import ChipWire, WorkerCreate
from tiletune.kernels.device import Chip
from tiletune.kernels.spec import KernelSpec


def registration(name: str, chip: Chip, kernels: Mapping[str, KernelSpec]) -> WorkerCreate:
    """The registration of worker ``name`` on ``chip`` running ``kernels`` (name -> spec)."""
    return WorkerCreate(
        name=name,
        chip=ChipWire(
            name=chip.name,
            kind=chip.kind,
            local_memory_bytes=chip.limits.local_memory_bytes,
            max_buffer_num=chip.limits.max_buffer_num,
            alignment_bytes=chip.limits.alignment_bytes,
            cores=chip.limits.cores,
        ),
        backends=sorted({backend for spec in kernels.values() for backend in spec.backends()}),
        kernels=sorted(kernels),
        kernel_versions={kernel: spec.version for kernel, spec in sorted(kernels.items())},
        kernel_backends={kernel: list(spec.backends()) for kernel, spec in sorted(kernels.items())},
        software=software_fingerprint(),
    )
