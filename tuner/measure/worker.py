"""The worker process: leases tuning jobs from a tiletune server and measures them on this chip.

Protocol (REST under ``/v1``; every write under a lease carries its fencing token in the path):

1. ``POST /v1/workers`` (:class:`WorkerCreate`: name, chip and its limits, backends, kernels,
   the backends of each kernel, software fingerprint: :mod:`tiletune.tuner.measure.registration`)
   -> the worker's id; once per process (again if the server forgets it).
2. ``POST /v1/leases`` ``{worker_id}`` -> a :class:`LeasePublic` (token, job with the backend to
   run, ``lease_s``, ``heartbeat_s``), or 204: no job for this chip now (poll again, or exit with
   ``once``).
3. While the lease is held, a background thread posts ``/v1/lease/heartbeat`` every
   ``heartbeat_s`` (the lease's token in ``X-Lease-Token``, as on every ``/v1/lease/…`` call).
4. ``POST /v1/lease/ask?n=batch&holding=...`` -> :class:`AskPublic`:
   ``search``: measure each task (constraint, check against the reference, timing) and
   ``tell`` the outcomes; ``validate``: measure the configs interleaved in one run and
   ``complete`` (which ends the lease); ``wait``: ask again after ``poll_s``; ``done``: release.
   Pipelined (the default): while a batch is measured, a background thread tells the previous
   batch's outcomes and asks for the next batch, saying which trials it is ``holding``, so the
   server's work and the round trips hide behind the measurement. Asks are idempotent: an
   answer lost on the way is asked again and comes back (:mod:`tiletune.tuner.measure.job_driver`).
5. ``POST /v1/lease/release`` ``{reason, failed}`` ends every other lease this worker ends.

Guarantees:

- One :class:`KernelBench` per job: inputs and the reference output are built once per lease
  (:mod:`tiletune.tuner.measure.job_bench`).
- Isolated trials (``isolate``, the default; never on a replay device): the configs run in a warm
  child process with a time limit per call (:mod:`tiletune.tuner.measure.isolation`), so a
  segfault, a hang past the limit or a device error fails that config with its reason and the job
  goes on. When a fresh child cannot run the job's default (within ``start_limit_s``, 120 s by
  default), a small built-in kernel's default is tried at once: when it runs, the job is released
  as failed with the reason (``"the default cannot run: ..."``) and the worker goes on leasing;
  when it does not, the device is unusable: the job is released as failed (``"device unusable:
  ..."``, logged at error level) and the worker leases nothing until a fresh child runs that
  built-in default again, checked after a cool-down that doubles from
  ``IsolationSettings.cooldown_s`` up to ``max_cooldown_s``.
- A wrong or crashing config is an outcome (``invalid`` / ``error``), never a crash of the worker.
  A job this worker cannot run (unknown kernel, another kernel version, a missing backend, a bad
  shape or dtype) is released with ``failed=true`` and the reason; so is a job whose run hits an
  unexpected error.
- Server away (connection errors, timeouts, 503 ``database_unavailable``, 507 ``storage_full``):
  every call is retried with capped exponential backoff (:class:`~tiletune.client.api.Backoff`,
  through the REST client's :class:`~tiletune.client.api.Retry`), each failure logged; the
  worker never crashes for it. Retrying a ``tell`` is safe: the server counts a trial once.
- A job the server keeps failing on (``MAX_SERVER_ERRORS`` consecutive 5xx other than 503/507 on one
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

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from tiletune.client.api import Backoff, Retry, ServiceApi, StopRequestedError, http_client
from tiletune.client.calls import (
    ApiError,
    LeaseLostError,
    ServerRefusedError,
    UnexpectedAnswerError,
)
from tiletune.client.wire import DEFAULT_BATCH, MAX_ASK, LeasePublic, WorkerCreate
from tiletune.kernels.device import Device, get_device
from tiletune.kernels.registry import kernels_for
from tiletune.kernels.replay.declaration import REPLAY_KERNELS_ENV, REPLAY_KIND
from tiletune.tuner.measure.bench import BenchSettings
from tiletune.tuner.measure.heartbeat import Heartbeat
from tiletune.tuner.measure.isolation import (
    DefaultFailedError,
    DeviceUnusableError,
    IsolationSettings,
    TrialPool,
)
from tiletune.tuner.measure.job_bench import UnsupportedJobError, bench_for
from tiletune.tuner.measure.job_driver import STOP_RELEASE_ATTEMPTS, JobDriver, LeasedRun, Release, Sleep
from tiletune.tuner.measure.registration import registration

logger = logging.getLogger(__name__)

STOP_REASON = "worker stopping"
#: The most configs one ``ask`` may request (the server's limit on ``n``).
MAX_BATCH = MAX_ASK
#: Consecutive 5xx answers (other than 503) to one call of a job after which the job is given up.
MAX_SERVER_ERRORS = 5

Clock = Callable[[], float]


class WorkerRejectedError(RuntimeError):
    """The server refuses this worker (bad token, rejected registration): retrying will not help."""


class Worker:
    """Leases jobs from a tiletune server, measures them on one device, reports them.

    ``http``'s ``base_url`` is the server (tests pass Starlette's ``TestClient``);
    ``backend`` is the device kind (``cpu``, ``cuda``, ``npu``, ``auto``), unless
    ``device`` is given; the kernel implementation comes from each job. ``batch``
    configs are asked per ``ask``; ``pipeline`` asks for the next batch while one is
    measured (see the module docstring). ``sleep`` waits between polls and retries
    (default: an interruptible wait that :meth:`stop` cuts short); ``clock``
    (seconds) judges lease expiry. See the module docstring for the protocol
    and the guarantees. ``isolate`` runs the configs in a child process (``isolation``: its limits).
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
        isolate: bool = True,
        isolation: IsolationSettings | None = None,
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
        self._driver = JobDriver(
            self._api,
            batch=batch,
            ahead=self._ahead,
            sleep=self._sleep,
            poll_s=poll_s,
            stopping=self._stopping,
        )
        self._device = device if device is not None else get_device(backend)
        replay = self._device.kind == REPLAY_KIND  # nothing runs: nothing to isolate
        self._trials = TrialPool(isolation) if isolate and not replay else None
        self._device_unusable = False
        self._bench_settings = bench or BenchSettings()
        self._clock = clock
        self._poll_s = poll_s
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
        if self._trials is not None:
            self._trials.close()
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
        """What this worker tells the server about itself (:mod:`tiletune.tuner.measure.registration`).

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
        return registration(self.name, chip, kernels)

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
                if self._device_unusable:
                    self._await_usable_device()
                    continue
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

    def _await_usable_device(self) -> None:
        """Lease nothing until a fresh trial process runs a small kernel's default on the device:
        checked after each cool-down (doubling up to its cap), each failure logged as an error."""
        assert self._trials is not None
        settings = self._trials.settings
        cooldown_s = settings.cooldown_s
        while not self.stopping:
            logger.error("worker %s: the device is unusable; checking it in %g s", self.name, cooldown_s)
            self._sleep(cooldown_s)
            if self._stopping.is_set():
                return
            problem = self._trials.health_problem(self._device)
            if problem is None:
                logger.warning("worker %s: the device runs kernels again; leasing jobs", self.name)
                self._device_unusable = False
                return
            logger.error("worker %s: the device is still unusable: %s", self.name, problem)
            cooldown_s = min(2 * cooldown_s, settings.max_cooldown_s)

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

    def _attempt(self, lease: LeasePublic, heartbeat: Heartbeat) -> Release | None:
        """Drive the job; map how it ended to a release (None: the lease is over, send nothing)."""
        job_id = lease.job.id
        run = None
        try:
            first = self._driver.first_ask(lease, self._device.chip.limits)  # builds while readying
            bench = bench_for(lease.job, self._device, self._bench_settings, self._trials)
            run = LeasedRun(lease, heartbeat, bench)
            return self._driver.drive(run, first)
        except LeaseLostError as lost:
            logger.warning("job %d: lease lost (%s); dropping the job", job_id, lost)
            return None
        except StopRequestedError:
            if run is not None:
                self._driver.tell_before_stopping(run)
            return Release(STOP_REASON, attempts=STOP_RELEASE_ATTEMPTS)
        except DefaultFailedError as error:
            logger.error("job %d: its default cannot run: %s", job_id, error)
            return Release(f"the default cannot run: {error}", failed=True)
        except DeviceUnusableError as error:
            logger.error("job %d: device unusable: %s; leasing nothing until it runs again", job_id, error)
            self._device_unusable = True
            return Release(f"device unusable: {error}", failed=True)
        except UnsupportedJobError as error:
            logger.warning("job %d: cannot run it here: %s", job_id, error)
            return Release(f"worker {self.name} cannot run this job: {error}", failed=True)
        except (ServerRefusedError, UnexpectedAnswerError) as error:
            logger.error("job %d: %s", job_id, error)
            if isinstance(error, ServerRefusedError) and error.status >= 500:
                tries = f"{MAX_SERVER_ERRORS} times in a row"
                return Release(f"the server failed on this job {tries}: {error}", failed=True)
            return Release(f"server rejected the worker's request: {error}", failed=True)
        except Exception as error:  # a bug or a broken device must not kill the worker
            logger.exception("job %d: unexpected error", job_id)
            return Release(f"worker error: {type(error).__name__}: {error}", failed=True)

    def _release(self, lease: LeasePublic, release: Release) -> None:
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
