"""Following the sweep ``tiletune up --submit FILE`` submitted: a line per job as it finishes, a summary.

:class:`SweepFollower` has no thread of its own: ``up``'s main loop calls :meth:`~SweepFollower.poll`
about once a second, and each call fetches the sweep once, prints a line for every job that
finished since the last call (:func:`~tiletune.service.cli.text.job_line`) and, once the sweep
is finished, the summary (:func:`~tiletune.service.cli.text.summary_line`). A server that
answers 5xx or not at all is tried again at the next poll (``up`` itself notices a server
that has stopped). Client side only: the REST client and the wire schemas.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import TextIO

from tiletune.client.api import ServiceApi
from tiletune.client.calls import ServerRefusedError, ServerUnreachableError
from tiletune.client.wire import LIVE_JOB_STATES, JobState, SweepCreate, SweepPublic, SweepState
from tiletune.service.cli.text import job_line, summary_line

log = logging.getLogger(__name__)


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
        return self.sweep.state == SweepState.FINISHED

    @property
    def failed_jobs(self) -> list[int]:
        """The ids of the sweep's failed jobs."""
        return [job.id for job in self.sweep.jobs if job.state == JobState.FAILED]

    def poll(self) -> bool:
        """Fetch the sweep once and report what finished since the last poll; True once it is finished.

        A 5xx or no answer is logged and tried again at the next poll; a 4xx raises
        :class:`~tiletune.client.calls.ServerRefusedError`.
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
