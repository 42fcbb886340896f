"""Driving one leased job: ask for configs, measure them, tell the outcomes, run the validation.

:class:`JobDriver` runs the ask/tell loop of one lease (see :mod:`tiletune.tuner.measure.worker`
for the protocol) until the server says ``done`` (a :class:`Release` to send) or the job is
validated (``complete`` ended the lease: nothing to send):

- ``search``: measure each task (a config outside the kernel's space is ``invalid``, else the
  bench decides: constraint, check against the reference, timing) and tell the outcomes.
  Pipelined (an ``ahead`` thread): while a batch is measured, the previous batch's outcomes are
  told and the next batch asked in the background, saying which trials are ``holding``;
- ``validate``: measure the configs interleaved in one run and ``complete``;
- ``wait``: ask again after ``poll_s``.

Between steps a lost lease is dropped first (the heartbeat's check: nothing more is written under
its token), then a stop is honoured (:class:`~tiletune.client.api.StopRequestedError`); stopping,
:meth:`JobDriver.tell_before_stopping` tells what was measured in a few attempts. An isolated bench
finding the device unusable (:class:`~tiletune.tuner.measure.isolation.DeviceUnusableError`) ends
the batch: what was measured is told, then the error is raised for the worker to release the job.

A kernel whose configs are builds (build-time knobs) has each batch built ahead
(:mod:`tiletune.tuner.measure.build_ahead`): the batch asked ahead starts building as soon as it is
answered, and a config is measured only once its build is in the cache. The lease's first batch is
asked before the bench is readied (:meth:`JobDriver.first_ask`), so it builds meanwhile.

When a job ends here (``done``, or validated) its time is logged at info level: the seconds spent
measuring (the trial process's calls, round trips and checks included, and the validation run),
the seconds waiting for builds, and the lease's wall seconds; the record carries them as
``record.job_time`` (a dict: ``measuring_s``, ``build_wait_s``, ``wall_s``, ``trials``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from tiletune.client.api import ServiceApi, StopRequestedError
from tiletune.client.calls import ApiError
from tiletune.client.space import DeviceLimits
from tiletune.client.wire import AskPhase, AskPublic, Config, LeasePublic, Task, TrialOutcome
from tiletune.kernels.errors import InputError
from tiletune.tuner.measure.bench import KernelBench
from tiletune.tuner.measure.build_ahead import BuildAhead, shared_build_ahead
from tiletune.tuner.measure.heartbeat import Heartbeat
from tiletune.tuner.measure.isolation import DefaultFailedError, DeviceUnusableError
from tiletune.tuner.measure.job_bench import UnsupportedJobError, job_kernel
from tiletune.tuner.measure.result import outcome_of, validated_results

logger = logging.getLogger(__name__)

#: Attempts at telling and releasing when stopping: a stopping worker does not wait for the server.
STOP_RELEASE_ATTEMPTS = 3

Sleep = Callable[[float], object]


@dataclass(frozen=True)
class Release:
    """How a job ends for this worker: the release to send (``attempts``: None retries until stopped)."""

    reason: str
    failed: bool = False
    attempts: int | None = None


@dataclass
class LeasedRun:
    """One leased job in progress: its lease, heartbeat and bench, the best time measured so far."""

    lease: LeasePublic
    heartbeat: Heartbeat
    bench: KernelBench
    best_ms: float | None = None
    #: Outcomes measured and not yet told (pipelined: told with the next ask).
    untold: list[TrialOutcome] = field(default_factory=list)
    #: Set when a fresh trial process could not run the default mid-batch (the device's or the
    #: kernel's fault): raised once the untold outcomes are told.
    unusable: DeviceUnusableError | DefaultFailedError | None = None
    #: Seconds measuring (bench calls: checks, timed runs, the validation run), waiting for builds.
    measuring_s: float = 0.0
    build_wait_s: float = 0.0
    trials: int = 0
    started_s: float = field(default_factory=time.monotonic)

    @property
    def label(self) -> str:
        job = self.lease.job
        return f"job {job.id} ({job.kernel} {job.dtype})"


class JobDriver:
    """The ask/measure/tell loop of leased jobs; see the module docstring.

    ``batch`` configs are asked per ``ask``; ``ahead`` (one thread, or ``None``: not pipelined)
    tells and asks while a batch is measured; ``sleep`` waits ``poll_s`` before asking again;
    ``stopping`` set means stop after the current trial.
    """

    def __init__(
        self,
        api: ServiceApi,
        *,
        batch: int,
        ahead: ThreadPoolExecutor | None,
        sleep: Sleep,
        poll_s: float,
        stopping: threading.Event,
        builds: BuildAhead | None = None,
    ) -> None:
        self._api = api
        self.builds = builds if builds is not None else shared_build_ahead()
        self._batch = batch
        self._ahead = ahead
        self._sleep = sleep
        self._poll_s = poll_s
        self._stopping = stopping

    def first_ask(self, lease: LeasePublic, limits: DeviceLimits) -> AskPublic | None:
        """For a kernel whose configs are builds (and a pool to build them), the lease's first ask,
        made before its bench is readied: the answer's configs build while the trial process starts
        and the default is built and checked (pass it to :meth:`drive`). None for any other job."""
        job = lease.job
        try:
            spec, shape = job_kernel(job)
        except UnsupportedJobError:
            return None  # bench_for says why the job cannot run
        if self.builds.depth(spec) == 0:
            return None
        answer = self._api.ask(lease.token, self._batch)
        configs = [task.config for task in answer.tasks] or answer.validate_configs
        self.builds.submit_for(spec, shape, job.dtype, limits, configs)
        return answer

    def drive(self, run: LeasedRun, first: AskPublic | None = None) -> Release | None:
        """Ask and answer until the server says ``done`` or the job is validated (lease ended);
        ``first``: the lease's first answer when it was asked already (:meth:`first_ask`)."""
        answer = first if first is not None else self._api.ask(run.lease.token, self._batch)
        while True:
            self._step(run)
            if answer.phase == AskPhase.SEARCH and answer.tasks:
                answer = self._search(run, answer.tasks)
                continue
            told = bool(run.untold)
            self._tell(run)
            if answer.phase == AskPhase.VALIDATE:
                return self._validate(run, answer.validate_configs)
            if answer.phase == AskPhase.DONE:
                _log_job_time(run)
                return Release("job done")
            if not told:  # wait (others hold the rest), or a search with nothing to measure yet
                self._sleep(self._poll_s)
            # else: the answer was asked ahead of these outcomes, which may end the search: ask now
            answer = self._api.ask(run.lease.token, self._batch)

    def tell_before_stopping(self, run: LeasedRun) -> None:
        """Stopping: tell what was measured (a few attempts; failing those the trials are asked again)."""
        try:
            self._tell(run, attempts=STOP_RELEASE_ATTEMPTS)
        except ApiError as error:
            logger.warning(
                "%s: could not tell %d outcome(s) before stopping (%s)", run.label, len(run.untold), error
            )

    def _step(self, run: LeasedRun) -> None:
        """Between steps: drop a lost lease first (no more writes), then honour a stop."""
        run.heartbeat.check()
        if run.unusable is not None:
            self._tell(run)
            raise run.unusable
        if self._stopping.is_set():
            raise StopRequestedError(run.label)

    def _search(self, run: LeasedRun, tasks: Sequence[Task]) -> AskPublic:
        """Measure ``tasks`` (stopping after the current one if asked); the server's next answer.

        Pipelined, the previous batch is told and the next one asked in the background meanwhile
        (these outcomes are told with the next ask); otherwise they are told, then asked after.
        """
        self.builds.submit(run.bench, [task.config for task in tasks])
        if self._ahead is None:
            outcomes = self._measure_all(run, tasks)
            run.untold = outcomes
            self._tell(run)
            return self._api.ask(run.lease.token, self._batch)
        previous, run.untold = run.untold, []
        holding = [task.trial_id for task in tasks]
        ahead = self._ahead.submit(self._tell_and_ask, run.lease.token, previous, holding, run.bench)
        try:
            outcomes = self._measure_all(run, tasks)
        except BaseException:
            run.untold = previous
            _wait_quietly(ahead)
            raise
        try:
            answer = ahead.result()
        except BaseException:
            run.untold = previous + outcomes  # told again is counted once
            raise
        run.untold = outcomes
        return answer

    def _tell_and_ask(
        self, token: str, outcomes: Sequence[TrialOutcome], holding: Sequence[int], bench: KernelBench
    ) -> AskPublic:
        """The background step of a pipelined search: tell ``outcomes``, then ask past ``holding``, and
        start building the configs of the answer (a kernel whose configs are builds)."""
        if outcomes:
            self._api.tell(token, outcomes)
        answer = self._api.ask(token, self._batch, holding)
        self.builds.submit(bench, [task.config for task in answer.tasks] or answer.validate_configs)
        return answer

    def _measure_all(self, run: LeasedRun, tasks: Sequence[Task]) -> list[TrialOutcome]:
        outcomes: list[TrialOutcome] = []
        for task in tasks:
            if self._stopping.is_set():
                break
            run.heartbeat.check()
            try:
                outcomes.append(self._measure(run, task))
            except (DeviceUnusableError, DefaultFailedError) as error:  # told, then raised (_step)
                run.unusable = error
                break
        return outcomes

    def _tell(self, run: LeasedRun, attempts: int | None = None) -> None:
        """Tell the outcomes measured and not yet told."""
        if not run.untold:
            return
        run.heartbeat.check()
        told = self._api.tell(run.lease.token, run.untold, attempts=attempts)
        run.untold = []
        logger.debug("%s: told %d (%d repeated)", run.label, told.accepted, told.repeated)

    def _measure(self, run: LeasedRun, task: Task) -> TrialOutcome:
        """One task: a config outside the kernel's space is invalid, else the bench decides."""
        try:
            bench = run.bench
            config = bench.spec.parse_config(task.config, bench.shape, bench.device.chip.limits)
        except InputError as error:
            return TrialOutcome(trial_id=task.trial_id, invalid=str(error))
        started = time.monotonic()
        self.builds.ready(bench, config)  # never a compile inside the timed runs
        measuring = time.monotonic()
        result = run.bench.evaluate(config, run.best_ms)
        run.build_wait_s += measuring - started
        run.measuring_s += time.monotonic() - measuring
        run.trials += 1
        measurement = result.measurement
        if measurement is not None and not measurement.pruned:
            run.best_ms = min(run.best_ms or measurement.median_ms, measurement.median_ms)
        return outcome_of(task.trial_id, result)

    def _validate(self, run: LeasedRun, configs: Sequence[Config]) -> Release | None:
        """The final interleaved run of the server's top configs, then ``complete`` (ends the lease)."""
        if not configs:
            return Release("the server asked to validate no configs", failed=True)
        logger.info("%s: validating %d configs interleaved", run.label, len(configs))
        started = time.monotonic()
        self.builds.ready_all(run.bench, configs)
        measuring = time.monotonic()
        results = validated_results(run.bench, configs)
        run.build_wait_s += measuring - started
        run.measuring_s += time.monotonic() - measuring
        run.heartbeat.check()
        self._api.complete(run.lease.token, results)
        logger.info("%s: validation run reported; the job is complete", run.label)
        _log_job_time(run)
        return None


def _log_job_time(run: LeasedRun) -> None:
    """Log where the job's time went (see the module docstring)."""
    wall_s = time.monotonic() - run.started_s
    job_time = {
        "measuring_s": run.measuring_s,
        "build_wait_s": run.build_wait_s,
        "wall_s": wall_s,
        "trials": run.trials,
    }
    logger.info(
        "%s: %d trials; measuring %.1f s, waiting for builds %.1f s, of %.1f s",
        run.label,
        run.trials,
        run.measuring_s,
        run.build_wait_s,
        wall_s,
        extra={"job_time": job_time},
    )


def _wait_quietly(future: Future[AskPublic]) -> None:
    """Let a background call finish (its outcome no longer matters)."""
    with contextlib.suppress(BaseException):  # the caller is already raising its own error
        future.result()
