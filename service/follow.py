"""Following the sweep ``tiletune up --submit FILE`` submitted: a line per job as it finishes, a summary.

:class:`SweepFollower` has no thread of its own: ``up``'s main loop calls :meth:`~SweepFollower.poll`
about once a second, and each call fetches the sweep once, prints a line for every job that
finished since the last call (:func:`job_line`) and, once the sweep is finished, the summary
(:func:`summary_line`). A server that answers 5xx or not at all is tried again at the next
poll (``up`` itself notices a server that has stopped). Client side only, like
:mod:`tiletune.service.remote`.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Callable
from typing import TextIO

from tiletune.client.wire import JobPublic, SweepCreate, SweepPublic
from tiletune.service.remote import (
    FAILED_JOB_STATES,
    FINISHED_SWEEP,
    LIVE_JOB_STATES,
    ServerRefusedError,
    ServerUnreachableError,
    ServiceApi,
    counts_text,
    kernels_text,
    ms_text,
)

log = logging.getLogger(__name__)

#: The multiplication sign, between a speedup and "faster" (1.80 TIMES faster).
TIMES = "\N{MULTIPLICATION SIGN}"


def _times(speedup: float) -> str:
    """E.g. ``1.80 TIMES faster``, or ``1.25 TIMES slower`` below 1 (without the spaces)."""
    return f"{speedup:.2f}{TIMES} faster" if speedup >= 1 else f"{1 / speedup:.2f}{TIMES} slower"


def job_line(job: JobPublic) -> str:
    """``kernel shape dtype: state, best X ms vs default Y ms (Z TIMES faster)``.

    A job without a measured best (failed, cancelled, skipped) gives its last failure
    reason, if any, instead of the timings.
    """
    head = f"{job.kernel} {job.shape_key} {job.dtype}: {job.state}"
    progress = job.progress
    if progress.best_ms is None:
        return f"{head} ({job.failure_reasons[-1]})" if job.failure_reasons else head
    line = f"{head}, best {ms_text(progress.best_ms)} ms vs default {ms_text(progress.default_ms)} ms"
    return f"{line} ({_times(progress.speedup_vs_default)})" if progress.speedup_vs_default else line


def summary_line(sweep: SweepPublic, elapsed_s: float) -> str:
    """The finished sweep in one line: its jobs by state and the speedups of those that have one."""
    line = f"sweep {sweep.id} ({kernels_text(sweep)}) {sweep.state} in {elapsed_s:.0f} s"
    line = f"{line}: {counts_text(sweep)}"
    speedups = [job.progress.speedup_vs_default for job in sweep.jobs if job.progress.speedup_vs_default]
    if not speedups:
        return line
    if len(speedups) == 1:
        return f"{line}; speedup over default {speedups[0]:.2f}{TIMES}"
    geomean = math.exp(sum(math.log(s) for s in speedups) / len(speedups))
    return (
        f"{line}; speedup over default {min(speedups):.2f}{TIMES}-{max(speedups):.2f}{TIMES}"
        f" (geometric mean {geomean:.2f}{TIMES})"
    )


class SweepFollower:
    """Reports a sweep's jobs as they finish, then its summary, on ``out`` (default stdout)."""

    def __init__(
        self,
        api: ServiceApi,
        sweep: SweepPublic,
        out: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sweep = sweep
        self._api = api
        self._out = out
        self._clock = clock
        self._started = clock()
        self._reported: set[int] = set()
        self._summarized = False
        self._report()

    @classmethod
    def submit(cls, api: ServiceApi, request: SweepCreate, out: TextIO | None = None) -> SweepFollower:
        """Submit ``request`` and follow the sweep (the server's refusal raises, as for ``submit``)."""
        sweep = api.submit(request)
        plural = "s" if len(sweep.jobs) != 1 else ""
        text = f"submitted sweep {sweep.id}: {len(sweep.jobs)} job{plural}"
        print(text, file=out or sys.stdout, flush=True)
        return cls(api, sweep, out)

    @property
    def finished(self) -> bool:
        """True once the server says the sweep is finished (its summary is printed by then)."""
        return self.sweep.state == FINISHED_SWEEP

    @property
    def failed_jobs(self) -> list[int]:
        """The ids of the sweep's failed jobs."""
        return [job.id for job in self.sweep.jobs if job.state in FAILED_JOB_STATES]

    def poll(self) -> bool:
        """Fetch the sweep once and report what finished since the last poll; True once it is finished.

        A 5xx or no answer is logged and tried again at the next poll; a 4xx raises
        :class:`~tiletune.service.remote.ServerRefusedError`.
        """
        try:
            self.sweep = self._api.sweep(self.sweep.id)
        except (ServerUnreachableError, ServerRefusedError) as error:
            if isinstance(error, ServerRefusedError) and error.status < 500:
                raise
            log.warning("sweep %d: %s; asking again", self.sweep.id, error)
            return False
        self._report()
        return self.finished

    def _report(self) -> None:
        out = self._out or sys.stdout
        for job in self.sweep.jobs:
            if job.state not in LIVE_JOB_STATES and job.id not in self._reported:
                self._reported.add(job.id)
                print(job_line(job), file=out, flush=True)
        if self.finished and not self._summarized:
            self._summarized = True
            print(summary_line(self.sweep, self._clock() - self._started), file=out, flush=True)
