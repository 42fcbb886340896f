"""The bench of a leased job: what this worker measures it with, or why it cannot run it here.

:func:`bench_for` checks a leased job against this machine (:func:`job_kernel`: the kernel is
registered here at the job's version, has the job's backend built, takes its shape and dtype; and
it runs on the device)
and builds its :class:`~tiletune.tuner.measure.bench.KernelBench` once per lease (inputs and the
reference output; a lookup bench on a replay device). Anything this worker cannot run is an
:class:`UnsupportedJobError` saying why, which the worker releases as failed. Given a
:class:`~tiletune.tuner.measure.isolation.TrialPool`, the bench of a real device runs its configs
in the pool's child process (a replay bench never needs it); a kernel whose configs are builds has its
default built here first, since the child checks it, timed, and derives the trials' time limits
from that time (:meth:`~tiletune.tuner.measure.build_ahead.BuildAhead.ready_default`).
"""

from __future__ import annotations

from tiletune.client.wire import LeasedJob
from tiletune.kernels.declaration import Shape
from tiletune.kernels.device import Device, ReplayDevice
from tiletune.kernels.errors import InputError, UnknownKernelError
from tiletune.kernels.registry import get_kernel, runs_on
from tiletune.kernels.spec import KernelSpec, torch_dtype
from tiletune.tuner.measure.bench import BenchSettings, KernelBench
from tiletune.tuner.measure.build_ahead import shared_build_ahead
from tiletune.tuner.measure.isolation import TrialPool
from tiletune.tuner.measure.replay_bench import ReplayBench


class UnsupportedJobError(Exception):
    """This worker cannot run the leased job; the message says why."""


def job_kernel(job: LeasedJob) -> tuple[KernelSpec, Shape]:
    """The kernel and shape of ``job`` as registered here: :class:`UnsupportedJobError` if this
    worker has no such kernel, another version of it, not the job's backend, or cannot parse the
    job's shape or dtype."""
    try:
        spec = get_kernel(job.kernel)
    except UnknownKernelError as error:
        raise UnsupportedJobError(str(error)) from None
    if spec.version != job.kernel_version:
        raise UnsupportedJobError(
            f"kernel {spec.name} is version {spec.version} here, the job wants version {job.kernel_version}"
        )
    if job.backend not in spec.backends():
        raise UnsupportedJobError(
            f"kernel {spec.name} has no backend {job.backend!r} here (it has {', '.join(spec.backends())})"
        )
    try:
        shape = spec.parse_shape(job.shape)
        torch_dtype(job.dtype)
    except InputError as error:
        raise UnsupportedJobError(str(error)) from None
    return spec, shape


def bench_for(
    job: LeasedJob, device: Device, settings: BenchSettings, isolation: TrialPool | None = None
) -> KernelBench:
    """The bench of ``job`` on ``device`` (isolated in ``isolation``'s child process when given);
    :class:`UnsupportedJobError` if it cannot run here (:func:`job_kernel`, or not on this device),
    and :class:`~tiletune.tuner.measure.isolation.DeviceUnusableError` if a fresh child cannot run
    its default."""
    spec, shape = job_kernel(job)
    if not runs_on(spec, device.kind):
        raise UnsupportedJobError(f"kernel {spec.name} does not run on a {device.kind} device")
    if isinstance(device, ReplayDevice):
        return ReplayBench(spec, shape, job.dtype, device, job.backend, settings)
    if isolation is not None:
        shared_build_ahead().ready_default(spec, shape, job.dtype, device.chip.limits)  # no compile timed
        return isolation.bench(spec, shape, job.dtype, device, backend=job.backend, settings=settings)
    return KernelBench(spec, shape, job.dtype, device, job.backend, settings)
