"""The worker process: leases tuning jobs from a tiletune server and measures them on this chip.

Protocol (REST under ``/v1``; every write under a lease carries its fencing token in the path):

1. ``POST /v1/workers`` (:class:`WorkerCreate`: name, chip and its limits, backends, kernels,
   software fingerprint) -> the worker's id; once per process (again if the server forgets it).
2. ``POST /v1/leases`` ``{worker_id}`` -> a :class:`LeasePublic` (token, job, ``lease_s``,
   ``heartbeat_s``), or 204: no job for this chip now (poll again, or exit with ``once``).
3. While the lease is held, a background thread posts ``/v1/lease/heartbeat`` every
   ``heartbeat_s`` (the lease's token in ``X-Lease-Token``, as on every ``/v1/lease/…`` call).
4. ``POST /v1/lease/ask?n=batch&holding=...`` -> :class:`AskPublic`:
   ``search``: measure each task (constraint, check against the reference, timing) and
   ``tell`` the outcomes; ``validate``: measure the configs interleaved in one run and
   ``complete`` (which ends the lease); ``wait``: ask again after ``poll_s``; ``done``: release.
   Pipelined (the default): while a batch is measured, a background thread tells the previous
   batch's outcomes and asks for the next batch, saying which trials it is ``holding``, so the
   server's work and the round trips hide behind the measurement. Asks are idempotent: an
   answer lost on the way is asked again and comes back.
5. ``POST /v1/lease/release`` ``{reason, failed}`` ends every other lease this worker ends.

Guarantees:

- One :class:`KernelBench` per job: inputs and the reference output are built once per lease.
- A wrong or crashing config is an outcome (``invalid`` / ``error``), never a crash of the worker.
  A job this worker cannot run (unknown kernel, another kernel version, a missing backend, a bad
  shape or dtype) is released with ``failed=true`` and the reason; so is a job whose run hits an
  unexpected error.
- Server away (connection errors, timeouts, 503 ``database_unavailable``): every call is retried
  with capped exponential backoff (:class:`~tiletune.client.api.Backoff`, through the REST
  client's :class:`~tiletune.client.api.Retry`), each failure logged; the worker never crashes
  for it. Retrying a ``tell`` is safe: the server counts a trial once.
- A job the server keeps failing on (``MAX_SERVER_ERRORS`` consecutive 5xx other than 503 on one
  call of the job): the lease is released as failed with the server's message (the job fails
  after the server's lease-failure limit) and the worker goes on to other jobs; 5xx on leasing
  or registering are retried after ``poll_s``.
- Lost lease (409 ``lease_lost`` on any lease call or heartbeat, or no successful renewal for
  ``lease_s``): the job is dropped at the next step, nothing more is written under that token,
  and the worker leases again. Outcomes measured but not told are lost; the server re-asks them.
- :meth:`Worker.stop` (the CLI calls it on SIGTERM and SIGINT): the current trial finishes, the
  outcomes already measured are told (a few attempts), the lease is released with reason ``"worker stopping"``
  (a few attempts; failing those it expires on the server and the job returns to the queue),
  and :meth:`Worker.run` returns.
- Refusal (401/403, or another 4xx where no job is at stake): :class:`WorkerRejectedError` is raised;
  it is a configuration error, and retrying would not help.

Speaks HTTP only through :class:`~tiletune.client.api.ServiceApi`; the lease's heartbeats
are :mod:`tiletune.tuner.measure.heartbeat`'s, the outcomes' wire form :mod:`tiletune.tuner.measure.result`'s.
Imports httpx, pydantic (the wire schemas), tiletune.kernels and the bench harness; never
Optuna, SQLAlchemy, FastAPI or tiletune.service, so a worker node needs none of them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

from tiletune.client.api import Backoff, Retry, ServiceApi, StopRequestedError, http_client
from tiletune.client.calls import (
    ApiError,
    LeaseLostError,
    ServerRefusedError,
    UnexpectedAnswerError,
)
from tiletune.client.chip import software_fingerprint
from tiletune.client.wire import (
    DEFAULT_BATCH,
    MAX_ASK,
    AskPhase,
    AskPublic,
    ChipWire,
    Config,
    LeasedJob,
    LeasePublic,
    Task,
    TrialOutcome,
    WorkerCreate,
)
from tiletune.kernels.device import Device, ReplayDevice, get_device
from tiletune.kernels.errors import InputError, UnknownKernelError
from tiletune.kernels.native_spec import cores_of
from tiletune.kernels.registry import get_kernel, kernels_for, runs_on
from tiletune.kernels.replay_kernels import REPLAY_KERNELS_ENV, REPLAY_KIND
from tiletune.kernels.spec import DeviceLimits, torch_dtype
from tiletune.tuner.measure.bench import BenchSettings, KernelBench
from tiletune.tuner.measure.heartbeat import Heartbeat
from tiletune.tuner.measure.replay_bench import ReplayBench
from tiletune.tuner.measure.result import outcome_of, validated_results

logger = logging.getLogger(__name__)

STOP_REASON = "worker stopping"
#: The most configs one ``ask`` may request (the server's limit on ``n``).
MAX_BATCH = MAX_ASK
#: Attempts at telling and releasing when stopping: a stopping worker does not wait for the server.
STOP_RELEASE_ATTEMPTS = 3
#: Consecutive 5xx answers (other than 503) to one call of a job after which the job is given up.
MAX_SERVER_ERRORS = 5
LEASE_LOST_CODE = "lease_lost"

Sleep = Callable[[float], object]
Clock = Callable[[], float]


class WorkerRejectedError(RuntimeError):
    """The server refuses this worker (bad token, rejected registration): retrying will not help."""


class UnsupportedJobError(Exception):
    """This worker cannot run the leased job; the message says why."""


# -- the worker ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Release:
    """How a job ends for this worker: the release to send (``attempts``: None retries until stopped)."""

    reason: str
    failed: bool = False
    attempts: int | None = None


@dataclass
class _Job:
    """One leased job in progress."""

    lease: LeasePublic
    heartbeat: Heartbeat
    bench: KernelBench
    best_ms: float | None = None
    #: Outcomes measured and not yet told (pipelined: told with the next ask).
    untold: list[TrialOutcome] = field(default_factory=list)

    @property
    def label(self) -> str:
        job = self.lease.job
        return f"job {job.id} ({job.kernel} {job.dtype})"


class Worker:
    """Leases jobs from a tiletune server, measures them on one device, reports them.

    ``http``'s ``base_url`` is the server (tests pass Starlette's ``TestClient``);
    ``backend`` is the device kind (``cpu``, ``cuda``, ``npu``, ``auto``), unless
    ``device`` is given; the kernel implementation comes from each job. ``batch``
    configs are asked per ``ask``; ``pipeline`` asks for the next batch while one is
    measured (see the module docstring). ``sleep`` waits between polls and retries
    (default: an interruptible wait that :meth:`stop` cuts short); ``clock``
    (seconds) judges lease expiry. See the module docstring for the protocol
    and the guarantees.
    """

    def __init__(
        self,
        http: httpx.Client,
        *,
        backend: str = "auto",
        name: str | None = None,
        bench: BenchSettings | None = None,
        batch: int = DEFAULT_BATCH,
        pipeline: bool = True,
        sleep: Sleep | None = None,
        clock: Clock = time.monotonic,
        backoff: Backoff | None = None,
        poll_s: float = 1.0,
        device: Device | None = None,
    ) -> None:
        if not 1 <= batch <= MAX_BATCH:
            raise ValueError(f"batch must be between 1 and {MAX_BATCH}, got {batch}")
        self._stopping = threading.Event()
        self._sleep: Sleep = sleep if sleep is not None else self._stopping.wait
        retry = Retry(
            backoff or Backoff(),
            stopping=self._stopping,
            sleep=self._sleep,
            max_server_errors=MAX_SERVER_ERRORS,
        )
        self._api = ServiceApi(http=http, retry=retry)
        self._ahead = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ask-ahead") if pipeline else None
        self._device = device if device is not None else get_device(backend)
        self._bench_settings = bench or BenchSettings()
        self._clock = clock
        self._poll_s = poll_s
        self.batch = batch
        self.name = name or f"{socket.gethostname()}-{os.getpid()}"
        self.worker_id: int | None = None

    @classmethod
    def connect(cls, url: str, token: str | None = None, **options: Any) -> Worker:
        """A worker of the server at ``url`` (``token``: its bearer token); ``options`` as for the class."""
        return cls(http_client(url, token), **options)

    def close(self) -> None:
        """Close the connections to the server."""
        if self._ahead is not None:
            self._ahead.shutdown(wait=True)
        self._api.close()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    @property
    def device(self) -> Device:
        """The device this worker measures on."""
        return self._device

    @property
    def stopping(self) -> bool:
        """True once :meth:`stop` was called."""
        return self._stopping.is_set()

    def stop(self) -> None:
        """Ask the worker to stop: finish the current trial, release the lease, return from run.

        Safe from any thread and from signal handlers; calling it again does nothing more.
        """
        if not self._stopping.is_set():
            logger.info("worker %s: stopping after the current trial", self.name)
        self._stopping.set()

    def registration(self) -> WorkerCreate:
        """What this worker tells the server about itself: chip, limits, backends, kernels, software.

        The kernels are those its device runs (:func:`~tiletune.kernels.registry.kernels_for`);
        a replay device without replay kernels (``$TILETUNE_REPLAY_KERNELS`` unset) raises
        :class:`WorkerRejectedError`, since an empty list would lease any job.
        """
        chip = self._device.chip
        kernels = kernels_for(chip.kind)
        if chip.kind == REPLAY_KIND and not kernels:
            raise WorkerRejectedError(
                f"a replay worker needs replay kernels: set ${REPLAY_KERNELS_ENV} to a directory of "
                "recorded spaces (*.json.gz)"
            )
        return WorkerCreate(
            name=self.name,
            chip=ChipWire(
                name=chip.name,
                kind=chip.kind,
                local_memory_bytes=chip.limits.local_memory_bytes,
                max_buffer_num=chip.limits.max_buffer_num,
                alignment_bytes=chip.limits.alignment_bytes,
                cores=reported_cores(chip.kind, chip.limits),
            ),
            backends=sorted({backend for spec in kernels.values() for backend in spec.backends()}),
            kernels=sorted(kernels),
            kernel_versions={name: spec.version for name, spec in sorted(kernels.items())},
            software=software_fingerprint(),
        )

    def register(self) -> int:
        """Register with the server (retrying while it is away); returns and keeps the worker id.

        Raises :class:`WorkerRejectedError` when the server refuses the registration,
        :class:`StopRequestedError` when stopped while waiting for the server.
        """
        while True:
            try:
                worker = self._api.register(self.registration())
                break
            except ServerRefusedError as error:
                if error.status < 500:
                    raise WorkerRejectedError(f"registration refused: {error}") from None
                logger.warning("worker %s: registration failed (%s); trying again", self.name, error)
                self._sleep(self._poll_s)
                if self.stopping:
                    raise StopRequestedError("registration") from None
            except UnexpectedAnswerError as error:
                raise WorkerRejectedError(f"registration refused: {error}") from None
        self.worker_id = worker.id
        logger.info("worker %s registered as %d on %s", self.name, worker.id, worker.chip)
        return worker.id

    def run(self, max_jobs: int | None = None, once: bool = False) -> int:
        """Lease and work jobs until stopped (or ``max_jobs`` are worked); returns the jobs worked.

        With ``once``, return as soon as the server has no job for this worker
        instead of polling every ``poll_s``. Never raises for a lost server or a
        lost lease; raises :class:`WorkerRejectedError` when the server refuses it.
        """
        worked = 0
        try:
            if self.worker_id is None and not self.stopping:
                self.register()
            while not self.stopping and (max_jobs is None or worked < max_jobs):
                lease = self._lease()
                if lease is None:
                    if once:
                        logger.info("worker %s: no job for this chip; exiting (once)", self.name)
                        break
                    self._sleep(self._poll_s)
                    continue
                self._work(lease)
                worked += 1
        except StopRequestedError:
            pass
        logger.info("worker %s: stopped after %d job(s)", self.name, worked)
        return worked

    # -- one job -----------------------------------------------------------------------------------

    def _lease(self) -> LeasePublic | None:
        """A lease, or None; registers again if the server has forgotten this worker."""
        assert self.worker_id is not None
        try:
            return self._api.lease(self.worker_id)
        except UnexpectedAnswerError as error:
            raise WorkerRejectedError(f"lease refused: {error}") from None
        except ServerRefusedError as error:
            if error.status >= 500:
                logger.warning("worker %s: leasing failed (%s); polling again", self.name, error)
                return None
            if error.status != 404:
                raise WorkerRejectedError(f"lease refused: {error}") from None
            logger.warning(
                "worker %s: the server does not know worker %d; registering again", self.name, self.worker_id
            )
            self.register()
            return None

    def _work(self, lease: LeasePublic) -> None:
        """Run one leased job to its end, heartbeating meanwhile, then release it unless lost."""
        job = lease.job
        logger.info("leased job %d: %s %s %s (%s)", job.id, job.kernel, job.shape, job.dtype, job.backend)
        heartbeat = Heartbeat(self._api, lease, self._clock)
        heartbeat.start()
        try:
            release = self._attempt(lease, heartbeat)
        finally:
            heartbeat.stop()
        if release is not None:
            self._release(lease, release)

    def _attempt(self, lease: LeasePublic, heartbeat: Heartbeat) -> _Release | None:
        """Drive the job; map how it ended to a release (None: the lease is over, send nothing)."""
        job_id = lease.job.id
        job = None
        try:
            job = _Job(lease, heartbeat, self._bench_for(lease.job))
            return self._drive(job)
        except LeaseLostError as lost:
            logger.warning("job %d: lease lost (%s); dropping the job", job_id, lost)
            return None
        except StopRequestedError:
            if job is not None:
                self._tell_before_stopping(job)
            return _Release(STOP_REASON, attempts=STOP_RELEASE_ATTEMPTS)
        except UnsupportedJobError as error:
            logger.warning("job %d: cannot run it here: %s", job_id, error)
            return _Release(f"worker {self.name} cannot run this job: {error}", failed=True)
        except (ServerRefusedError, UnexpectedAnswerError) as error:
            logger.error("job %d: %s", job_id, error)
            if isinstance(error, ServerRefusedError) and error.status >= 500:
                tries = f"{MAX_SERVER_ERRORS} times in a row"
                return _Release(f"the server failed on this job {tries}: {error}", failed=True)
            return _Release(f"server rejected the worker's request: {error}", failed=True)
        except Exception as error:  # a bug or a broken device must not kill the worker
            logger.exception("job %d: unexpected error", job_id)
            return _Release(f"worker error: {type(error).__name__}: {error}", failed=True)

    def _release(self, lease: LeasePublic, release: _Release) -> None:
        """Give the lease back; a lease already gone or a server away is only logged."""
        try:
            self._api.release(lease.token, release.reason, release.failed, attempts=release.attempts)
        except LeaseLostError:
            logger.info("job %d: lease already ended on release", lease.job.id)
            return
        except ApiError as error:
            logger.warning("job %d: release failed (%s); the lease will expire", lease.job.id, error)
            return
        logger.info(
            "job %d: released (%s%s)", lease.job.id, release.reason, ", failed" if release.failed else ""
        )

    def _bench_for(self, job: LeasedJob) -> KernelBench:
        """The job's bench (inputs, reference built once; a lookup on a replay device);
        :class:`UnsupportedJobError` if it cannot run here."""
        try:
            spec = get_kernel(job.kernel)
        except UnknownKernelError as error:
            raise UnsupportedJobError(str(error)) from None
        if spec.version != job.kernel_version:
            raise UnsupportedJobError(
                f"kernel {spec.name} is version {spec.version} here, the job wants "
                f"version {job.kernel_version}"
            )
        if job.backend not in spec.backends():
            raise UnsupportedJobError(
                f"kernel {spec.name} has no backend {job.backend!r} here "
                f"(it has {', '.join(spec.backends())})"
            )
        try:
            shape = spec.parse_shape(job.shape)
            torch_dtype(job.dtype)
        except InputError as error:
            raise UnsupportedJobError(str(error)) from None
        if not runs_on(spec, self._device.kind):
            raise UnsupportedJobError(f"kernel {spec.name} does not run on a {self._device.kind} device")
        if isinstance(self._device, ReplayDevice):
            return ReplayBench(spec, shape, job.dtype, self._device, job.backend, self._bench_settings)
        return KernelBench(spec, shape, job.dtype, self._device, job.backend, self._bench_settings)

    def _drive(self, job: _Job) -> _Release | None:
        """Ask and answer until the server says ``done`` or the job is validated (lease ended)."""
        answer = self._api.ask(job.lease.token, self.batch)
        while True:
            self._step(job)
            if answer.phase == AskPhase.SEARCH and answer.tasks:
                answer = self._search(job, answer.tasks)
                continue
            told = bool(job.untold)
            self._tell(job)
            if answer.phase == AskPhase.VALIDATE:
                return self._validate(job, answer.validate_configs)
            if answer.phase == AskPhase.DONE:
                return _Release("job done")
            if not told:  # wait (others hold the rest), or a search with nothing to measure yet
                self._sleep(self._poll_s)
            # else: the answer was asked ahead of these outcomes, which may end the search: ask now
            answer = self._api.ask(job.lease.token, self.batch)

    def _step(self, job: _Job) -> None:
        """Between steps: drop a lost lease first (no more writes), then honour a stop."""
        job.heartbeat.check()
        if self.stopping:
            raise StopRequestedError(job.label)

    def _search(self, job: _Job, tasks: Sequence[Task]) -> AskPublic:
        """Measure ``tasks`` (stopping after the current one if asked); the server's next answer.

        Pipelined, the previous batch is told and the next one asked in the background meanwhile
        (these outcomes are told with the next ask); otherwise they are told, then asked after.
        """
        if self._ahead is None:
            outcomes = self._measure_all(job, tasks)
            job.untold = outcomes
            self._tell(job)
            return self._api.ask(job.lease.token, self.batch)
        previous, job.untold = job.untold, []
        holding = [task.trial_id for task in tasks]
        ahead = self._ahead.submit(self._tell_and_ask, job.lease.token, previous, holding)
        try:
            outcomes = self._measure_all(job, tasks)
        except BaseException:
            job.untold = previous
            _wait_quietly(ahead)
            raise
        try:
            answer = ahead.result()
        except BaseException:
            job.untold = previous + outcomes  # told again is counted once
            raise
        job.untold = outcomes
        return answer

    def _tell_and_ask(
        self, token: str, outcomes: Sequence[TrialOutcome], holding: Sequence[int]
    ) -> AskPublic:
        """The background step of a pipelined search: tell ``outcomes``, then ask past ``holding``."""
        if outcomes:
            self._api.tell(token, outcomes)
        return self._api.ask(token, self.batch, holding)

    def _measure_all(self, job: _Job, tasks: Sequence[Task]) -> list[TrialOutcome]:
        outcomes: list[TrialOutcome] = []
        for task in tasks:
            if self.stopping:
                break
            job.heartbeat.check()
            outcomes.append(self._measure(job, task))
        return outcomes

    def _tell(self, job: _Job, attempts: int | None = None) -> None:
        """Tell the outcomes measured and not yet told."""
        if not job.untold:
            return
        job.heartbeat.check()
        told = self._api.tell(job.lease.token, job.untold, attempts=attempts)
        job.untold = []
        logger.debug("%s: told %d (%d repeated)", job.label, told.accepted, told.repeated)

    def _tell_before_stopping(self, job: _Job) -> None:
        """Stopping: tell what was measured (a few attempts; failing those the trials are asked again)."""
        try:
            self._tell(job, attempts=STOP_RELEASE_ATTEMPTS)
        except ApiError as error:
            logger.warning(
                "%s: could not tell %d outcome(s) before stopping (%s)", job.label, len(job.untold), error
            )

    def _measure(self, job: _Job, task: Task) -> TrialOutcome:
        """One task: a config outside the kernel's space is invalid, else the bench decides."""
        try:
            config = job.bench.spec.parse_config(task.config, job.bench.shape)
        except InputError as error:
            return TrialOutcome(trial_id=task.trial_id, invalid=str(error))
        result = job.bench.evaluate(config, job.best_ms)
        measurement = result.measurement
        if measurement is not None and not measurement.pruned:
            job.best_ms = min(job.best_ms or measurement.median_ms, measurement.median_ms)
        return outcome_of(task.trial_id, result)

    def _validate(self, job: _Job, configs: Sequence[Config]) -> _Release | None:
        """The final interleaved run of the server's top configs, then ``complete`` (ends the lease)."""
        if not configs:
            return _Release("the server asked to validate no configs", failed=True)
        logger.info("%s: validating %d configs interleaved", job.label, len(configs))
        results = validated_results(job.bench, configs)
        job.heartbeat.check()
        self._api.complete(job.lease.token, results)
        logger.info("%s: validation run reported; the job is complete", job.label)
        return None


def _wait_quietly(future: Future[AskPublic]) -> None:
    """Let a background call finish (its outcome no longer matters)."""
    with contextlib.suppress(BaseException):  # the caller is already raising its own error
        future.result()


def reported_cores(kind: str, limits: DeviceLimits) -> int | None:
    """The cores a worker reports for its chip (what its native kernels spread over): a CPU's,
    ``None`` for other kinds (their spaces read no cores)."""
    return cores_of(limits) if kind == "cpu" else limits.cores
