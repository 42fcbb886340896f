"""The worker protocol: register, lease, heartbeat, ask, tell, complete, release; reaping, cancelling.

Ties the queue (leases), the searches (one per job, in memory) and the repositories
together; each operation is one transaction (:meth:`Database.write`). Guarantees:

- every write under a lease is fenced by its token
  (:class:`~tiletune.service.errors.LeaseLostError` and nothing changed otherwise);
- ``ask`` is idempotent per lease: the trials the lease holds and the worker does not say it
  is ``holding`` come back first (a lost answer is asked again), then new valid configs as
  trials (rows ``asked``); when the search is done it hands one lease the final validation
  (:func:`tiletune.tuner.search.finalists.finalists`: the top configs, the default, the key's
  current best, torch's op: :func:`~tiletune.service.specs.vendor_finalist`), measured interleaved:
  never the lease of the worker whose search trial leads while another worker of its chip and
  software is online (:mod:`tiletune.service.scheduling.confirmation`; the leader is answered ``done``);
- ``tell`` is idempotent per trial: a repeated outcome is counted once; a time faster than the
  chip can run the call is stored ``failed`` (:mod:`tiletune.service.scheduling.plausibility`);
- ``complete`` promotes a config only when it beats torch's op and the default (else the first of
  them that ran), then the key's current best, beyond that same run's spread
  (:func:`tiletune.tuner.search.finalists.judge`), and the workers do not disagree on it, then
  ends the job (:func:`tiletune.service.scheduling.verdicts.settle`); a kept best measured with older
  software is re-validated with the worker's (:func:`tiletune.service.demand.retune.revalidate`);
- a lease that ends without a tell (released, expired) abandons its outstanding trials:
  they are asked again. Only trials under live leases are held: a trial left ``asked`` under
  a lease that is over (a crash between the reaper's commit and the abandon step) is
  abandoned when the job's search is next rebuilt, and before any ``wait`` is answered.

The trials table is the one record of each job's search; the searches in memory are rebuilt
from it (:mod:`tiletune.service.scheduling.searches`).

Job states change only through :mod:`tiletune.service.scheduling.lifecycle`.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from tiletune.client.wire import (
    MAX_ASK,
    AskPhase,
    AskPublic,
    CompleteCreate,
    Config,
    JobPublic,
    JobState,
    LeasedJob,
    LeasePublic,
    ReleaseCreate,
    Role,
    Task,
    TellCreate,
    TellPublic,
    TrialState,
    WorkerCreate,
    WorkerPublic,
)
from tiletune.service import configs, failpoints, fleet
from tiletune.service.access.auth import Identity
from tiletune.service.configs import JobKey
from tiletune.service.database import Database, aware
from tiletune.service.errors import ConflictError, InvalidInputError, LeaseLostError
from tiletune.service.metrics import ServiceMetrics
from tiletune.service.models import ChipRow, JobRow, LeaseRow, TrialRow
from tiletune.service.scheduling import confirmation, jobs, lifecycle
from tiletune.service.scheduling.lifecycle import Event
from tiletune.service.scheduling.plausibility import checked, floor_of
from tiletune.service.scheduling.queue import MAX_CLAIM_ATTEMPTS, JobQueue, Missed
from tiletune.service.scheduling.searches import SearchHost
from tiletune.service.scheduling.trials import (
    asked_again,
    asked_trials,
    asked_under_leases_over,
    check_outcome,
    outcome_reason,
    record_outcome,
    validation_rows,
)
from tiletune.service.scheduling.verdicts import settle
from tiletune.service.scheduling.warm_start import warm_start_configs
from tiletune.service.specs import vendor_finalist
from tiletune.service.views import job_public, worker_public
from tiletune.tuner.search.finalists import finalists
from tiletune.tuner.search.search import Search


class WorkerProtocol:
    """The worker protocol over the database, the queue and the jobs' searches."""

    def __init__(
        self,
        db: Database,
        queue: JobQueue,
        searches: SearchHost,
        metrics: ServiceMetrics,
        workers_create_chips: bool = True,
    ) -> None:
        self.db = db
        self.queue = queue
        self.searches = searches
        self.metrics = metrics
        self.workers_create_chips = workers_create_chips

    # -- workers and leases -----------------------------------------------------------------

    def register(self, request: WorkerCreate, caller: Identity) -> WorkerPublic:
        """Record a worker of ``caller``'s token and its chip (see :func:`fleet.register_worker`).

        A worker token registers only its own chip, and its first registration binds an unbound one
        (:func:`fleet.hold_to_chip`); an admin's registers any. Workers of a new chip registering at
        once race to create it; the loser tries again.
        """
        try:
            return self._register(request, caller)
        except IntegrityError:
            return self._register(request, caller)

    def _register(self, request: WorkerCreate, caller: Identity) -> WorkerPublic:
        rights = fleet.ChipRights(
            create=caller.may(Role.ADMIN) or self.workers_create_chips, change=caller.may(Role.ADMIN)
        )
        held = not caller.may(Role.ADMIN)
        with self.db.write() as session:
            worker, chip = fleet.register_worker(
                session, request, self.db.clock(), caller.token_id, rights, hold_token=held
            )
            return worker_public(worker, chip, dict(request.software))

    def lease(self, worker_id: int, caller: Identity) -> LeasePublic | None:
        """A lease on a job this worker (one of ``caller``'s token) can run, or ``None``.

        A worker token leases only for its own chip (binding an unbound one: a token from before
        bindings); an admin's for any.
        """
        self.reap()
        skipped: set[int] = set()
        for _ in range(MAX_CLAIM_ATTEMPTS):
            with self.db.write() as session:
                worker = fleet.touch_worker(session, worker_id, self.db.clock(), caller.token_id)
                if not caller.may(Role.ADMIN):
                    chip_name = session.get_one(ChipRow, worker.chip_id).name
                    fleet.hold_to_chip(session, caller.token_id, chip_name, "worker_id")
                claimed = self.queue.claim(session, worker, skipped)
                if claimed is None:
                    return None
                if isinstance(claimed, Missed):
                    continue
                lease, job = claimed
                first = self.queue.leases_of(session, job) == 1
                public = self._lease_public(lease, job)
            if first:
                self.metrics.first_lease(job.created_at, lease.created_at)
            return public
        return None

    def heartbeat(self, token: str, caller: Identity) -> LeasePublic:
        """Renew a lease."""
        with self.db.write() as session:
            return self._lease_public(*self.queue.heartbeat(session, token, caller.token_id))

    def _lease_public(self, lease: LeaseRow, job: JobRow) -> LeasePublic:
        settings = self.queue.settings
        assert job.default_config is not None
        assert job.backend is not None  # chosen by the claim that made the lease
        return LeasePublic(
            token=lease.token,
            job=LeasedJob(
                id=job.id,
                kernel=job.kernel,
                kernel_version=job.kernel_version,
                shape=job.shape,
                dtype=job.dtype,
                backend=job.backend,
                default_config=job.default_config,
            ),
            expires_at=aware(lease.expires_at),
            lease_s=settings.lease_s,
            heartbeat_s=settings.heartbeat_s,
        )

    # -- ask --------------------------------------------------------------------------------

    def ask(self, token: str, caller: Identity, n: int = 1, holding: Sequence[int] = ()) -> AskPublic:
        """Up to ``n`` configs to measure, or the validation, or ``wait`` / ``done``.

        ``holding``: the trial ids the worker has in hand (being measured); the lease's other
        outstanding trials are answered first, so asking again after a lost answer loses nothing.
        """
        if not 1 <= n <= MAX_ASK:
            raise InvalidInputError(f"n must be between 1 and {MAX_ASK}, got {n}", field="n")
        job_id = self._job_of(token)
        failpoints.reach("ask.start", job_id)
        with self.searches.held(job_id), self.db.write() as session:
            lease, job = self.queue.fence(session, token, caller.token_id)
            if lifecycle.is_final(job.state):
                return AskPublic(phase=AskPhase.DONE)
            if job.state == JobState.VALIDATING:
                return self._validation_or_done(session, job, lease)
            again = asked_again(session, job, lease, set(holding), n)
            tasks = again + self._new_tasks(session, job, lease, n - len(again))
            if tasks:
                return AskPublic(phase=AskPhase.SEARCH, tasks=tasks)
            if self._search(session, job).outstanding and self._abandon_over(session, job):
                tasks = self._new_tasks(session, job, lease, n)
                if tasks:
                    return AskPublic(phase=AskPhase.SEARCH, tasks=tasks)
            if self._search(session, job).outstanding:
                return AskPublic(phase=AskPhase.WAIT)
            lifecycle.move(job, Event.SEARCH_DONE, self.db.clock())
            confirmation.await_confirmer(session, job)
            return self._validation_or_done(session, job, lease)

    def _validation_or_done(self, session: Session, job: JobRow, lease: LeaseRow) -> AskPublic:
        """The validation run when ``lease`` validates ``job`` (taking it when none does and its
        worker may: :func:`~tiletune.service.scheduling.confirmation.may_validate`), else ``done``."""
        online_s, now = self.queue.settings.lease_s, self.db.clock()
        if job.validator_lease_id is None and confirmation.may_validate(
            session, job, lease.worker_id, now, online_s
        ):
            job.validator_lease_id = lease.id
        if job.validator_lease_id != lease.id:
            return AskPublic(phase=AskPhase.DONE)
        return AskPublic(phase=AskPhase.VALIDATE, validate_configs=self._finalists(session, job))

    def _new_tasks(self, session: Session, job: JobRow, lease: LeaseRow, n: int) -> list[Task]:
        """Up to ``n`` new configs from the job's search, recorded as trials asked under ``lease``."""
        if n < 1:
            return []
        candidates = self._search(session, job).ask(n)
        if not candidates:
            return []
        now = self.db.clock()
        for candidate in candidates:
            session.add(
                TrialRow(
                    job_id=job.id,
                    number=candidate.trial_id,
                    lease_id=lease.id,
                    phase="search",
                    config=candidate.config,
                    state=TrialState.ASKED,
                    asked_at=now,
                )
            )
        self.searches.changed(job)
        return [Task(trial_id=c.trial_id, config=c.config) for c in candidates]

    def _abandon_over(self, session: Session, job: JobRow) -> bool:
        """Abandon trials left asked under leases that are over; True when there were any.

        The search is rebuilt from the rows, which abandons them (see :mod:`searches`).
        """
        if not asked_under_leases_over(session, job, self.db.clock()):
            return False
        self.searches.forget(job.id)
        self._search(session, job)
        return True

    def _job_of(self, token: str) -> int:
        """The id of the lease's job, read without locks so its search lock can be taken first.

        Only the fence inside the write transaction that follows decides whether the lease is live.
        """
        with self.db.read() as session:
            job_id = session.scalar(select(LeaseRow.job_id).where(LeaseRow.token == token))
        if job_id is None:
            raise LeaseLostError("no such lease; lease a job again", field="token")
        return job_id

    def _search(self, session: Session, job: JobRow) -> Search:
        """The job's search (hold its lock): the one in memory if current, else rebuilt from its trials.

        A job without trials yet is warm-started
        (:func:`tiletune.service.scheduling.warm_start.warm_start_configs`: the nearest tuned shapes'
        best configs on its chip, then its key's best on other chips).
        """
        found = self.searches.cached(job)
        if found is not None:
            return found
        assert job.chip_id is not None
        limits = fleet.chip_limits(session.get_one(ChipRow, job.chip_id))
        return self.searches.rebuild(
            session, job, limits, self.db.clock(), lambda: warm_start_configs(session, job)
        )

    def _finalists(self, session: Session, job: JobRow) -> list[Config]:
        """The configs of the job's validation run (see :func:`tiletune.tuner.search.finalists.finalists`)."""
        top = [config for config, _ in self._search(session, job).best(job.validate_top)]
        best = configs.best_row(session, JobKey.of(job))
        incumbent = best.config if best is not None else None
        return finalists(top, job.default_config, incumbent, vendor_finalist(job.kernel))

    # -- tell -------------------------------------------------------------------------------

    def tell(self, token: str, caller: Identity, request: TellCreate) -> TellPublic:
        """Record outcomes of asked trials; a repeated outcome is counted once."""
        job_id = self._job_of(token)
        accepted = repeated = 0
        outcomes: list[str] = []
        with self.searches.held(job_id), self.db.write() as session:
            lease, job = self.queue.fence(session, token, caller.token_id)
            search = self._search(session, job) if not lifecycle.is_final(job.state) else None
            now, floor_ms = self.db.clock(), floor_of(session, job)
            numbers = [outcome.trial_id for outcome in request.outcomes]
            trials = asked_trials(session, job, lease, numbers)
            for index, (told, trial) in enumerate(zip(request.outcomes, trials, strict=True)):
                if trial.state != TrialState.ASKED:
                    repeated += 1
                    continue
                check_outcome(told, index)
                outcome = checked(told, floor_ms)
                record_outcome(job, trial, outcome, now)
                outcomes.append(trial.state)
                if search is not None:
                    time_ms = outcome.measurement.median_ms if outcome.measurement else None
                    search.tell(trial.number or 0, time_ms, outcome_reason(outcome))
                accepted += 1
            if accepted:
                self.searches.changed(job)
            job.updated_at = now
            failpoints.reach("tell.searched")
        for state in outcomes:
            self.metrics.trials.labels(state).inc()
        return TellPublic(accepted=accepted, repeated=repeated)

    # -- complete, release, cancel, reap ----------------------------------------------------

    def complete(self, token: str, caller: Identity, request: CompleteCreate) -> JobPublic:
        """Take the validation run, promote its winner if it beats the key's best, end the job."""
        job_id = self._job_of(token)
        with self.searches.held(job_id), self.db.write() as session:
            lease, job = self.queue.fence(session, token, caller.token_id)
            if job.state != JobState.VALIDATING or job.validator_lease_id != lease.id:
                raise ConflictError(f"job {job.id} is not waiting for this lease's validation", field="token")
            expected = self._finalists(session, job)
            for index, result in enumerate(request.results):
                if result.config not in expected:
                    raise InvalidInputError(
                        "not one of the configs asked to validate", f"results[{index}].config"
                    )
            floor_ms = floor_of(session, job)
            checked_results = [checked(result, floor_ms) for result in request.results]
            request = request.model_copy(update={"results": checked_results})
            rows = validation_rows(session, job, lease, request, self.db.clock())
            software_id = self.queue.worker_of(session, lease).software_id
            if not settle(session, job, lease, rows, software_id=software_id, now=self.db.clock()):
                self.queue.end(session, lease, job, "validation: no config ran correctly", failed=True)
                self.searches.forget(job.id)
                return job_public(session, job)
            lifecycle.move(job, Event.VALIDATED, self.db.clock())
            self.queue.end(session, lease, job, "completed", failed=False)
            self.searches.forget(job.id)
            public = job_public(session, job)
        if job.finished_at is not None:
            self.metrics.job_done(job.created_at, job.finished_at)
        return public

    def release(self, token: str, caller: Identity, request: ReleaseCreate) -> JobPublic:
        """End a lease by the worker's wish; its outstanding trials are asked again later."""
        job_id = self._job_of(token)
        with self.searches.held(job_id), self.db.write() as session:
            lease, job = self.queue.fence(session, token, caller.token_id)
            self._abandon(session, job, lease.id, f"lease released: {request.reason}")
            self.queue.end(session, lease, job, request.reason, failed=request.failed)
            public = job_public(session, job)
        if public.state == JobState.QUEUED:
            self.metrics.requeued.inc()
        return public

    def reap(self) -> int:
        """Return the jobs of expired leases to the queue and abandon their outstanding trials."""
        with self.db.write() as session:
            reaped = self.queue.reap(session)
        if reaped:
            failpoints.reach("reap.committed")
            self.metrics.leases_expired.inc(len(reaped))
        for job_id, lease_id in reaped:
            with self.searches.held(job_id), self.db.write() as session:
                job = session.get_one(JobRow, job_id)
                self._abandon(session, job, lease_id, "lease expired")
                requeued = job.state == JobState.QUEUED
            if requeued:
                self.metrics.requeued.inc()
        return len(reaped)

    def _abandon(self, session: Session, job: JobRow, lease_id: int, reason: str) -> None:
        """Mark the lease's asked trials abandoned, in our rows and in the job's study."""
        asked = session.scalars(
            select(TrialRow).where(
                TrialRow.job_id == job.id, TrialRow.lease_id == lease_id, TrialRow.state == TrialState.ASKED
            )
        ).all()
        if not asked:
            return
        search = self._search(session, job)
        now = self.db.clock()
        for trial in asked:
            trial.state = TrialState.ABANDONED
            trial.reason = reason
            trial.told_at = now
            if trial.number is not None and trial.number in search.outstanding_ids:
                search.abandon(trial.number, reason)
        self.searches.changed(job)

    def cancel_job(self, job_id: int, caller: Identity) -> JobPublic:
        """Cancel a job that has not finished; its leases see ``done`` at their next ask.

        An admin may cancel any job, a submitter the jobs of its own sweeps (403 otherwise).
        """
        with self.searches.held(job_id), self.db.write() as session:
            job = jobs.job_row(session, job_id)
            jobs.check_owner(session, job.sweep_id, caller)
            if lifecycle.allows(job.state, Event.CANCELLED):
                lifecycle.move(job, Event.CANCELLED, self.db.clock())
            self.searches.forget(job_id)
            return job_public(session, job)

    def cancel_sweep(self, sweep_id: int, caller: Identity) -> None:
        """Cancel every unfinished job of a sweep (an admin's, or its submitter's)."""
        with self.db.read() as session:
            jobs.check_owner(session, sweep_id, caller)
            live = [
                job.id for job in jobs.job_rows_of_sweep(session, sweep_id) if lifecycle.is_live(job.state)
            ]
        for job_id in live:
            self.cancel_job(job_id, caller)
