"""The worker protocol: register, lease, heartbeat, ask, tell, complete, release.

Ties the queue (leases), the searches (one Optuna study per job) and the
store together. Guarantees:

- every write under a lease is fenced by its token
  (:class:`~tiletune.service.errors.LeaseLostError` and nothing changed otherwise);
- ``ask`` hands out new valid configs as trials (rows ``asked``); when the
  search is done it hands one lease the final validation: the top configs,
  the default and the key's current best, to be measured interleaved;
- ``tell`` is idempotent per trial: a repeated outcome is counted once;
- ``complete`` promotes the fastest validated config only when it beats the
  key's current best in that same run (or the key has none), then ends the job;
- a lease that ends without a tell (released, expired) abandons its
  outstanding trials: they are failed in the study and asked again.
"""

from __future__ import annotations

import math
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from tiletune.client.wire import (
    MAX_ASK,
    AskPublic,
    CompleteCreate,
    JobPublic,
    LeasedJob,
    LeasePublic,
    ReleaseCreate,
    Task,
    TellCreate,
    TellPublic,
    TrialOutcome,
    WorkerCreate,
    WorkerPublic,
)
from tiletune.kernels import Config
from tiletune.service.errors import ConflictError, InvalidInputError, LeaseLostError
from tiletune.service.models import ChipRow, JobRow, LeaseRow, TrialRow, WorkerRow
from tiletune.service.queue import FINISHED_STATES, JobQueue
from tiletune.service.store import JobKey, Store, Winner, aware, chip_limits, lookup_kernel
from tiletune.service.studies import StudyHost
from tiletune.tuner.search import Search

#: Nearest tuned shapes whose best configs seed a new job's search.
WARM_START_NEIGHBOURS = 3


class Tuning:
    """The worker protocol over a store, a queue and the jobs' searches."""

    def __init__(self, store: Store, queue: JobQueue, studies: StudyHost) -> None:
        self.store = store
        self.queue = queue
        self.studies = studies

    # -- workers and leases -----------------------------------------------------------------

    def register(self, request: WorkerCreate) -> WorkerPublic:
        """Record a worker and its chip."""
        worker, chip = self.store.register_worker(request)
        return _worker_public(worker, chip, dict(request.software))

    def lease(self, worker_id: int) -> LeasePublic | None:
        """A lease on a job this worker can run, or ``None``."""
        self.reap()
        claimed = self.queue.lease(worker_id)
        if claimed is None:
            return None
        lease, job = claimed
        return self._lease_public(lease, job)

    def heartbeat(self, token: str) -> LeasePublic:
        """Renew a lease."""
        lease = self.queue.heartbeat(token)
        with self.store.reads() as session:
            return self._lease_public(lease, session.get_one(JobRow, lease.job_id))

    def _lease_public(self, lease: LeaseRow, job: JobRow) -> LeasePublic:
        settings = self.queue.settings
        assert job.default_config is not None
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

    def ask(self, token: str, n: int = 1) -> AskPublic:
        """Up to ``n`` configs to measure, or the validation, or ``wait`` / ``done``."""
        if not 1 <= n <= MAX_ASK:
            raise InvalidInputError(f"n must be between 1 and {MAX_ASK}, got {n}", field="n")
        job_id = self._job_of(token)
        with self.studies.lock(job_id), self.store.sessions.begin() as session:
            lease, job = self.queue.fence(session, token)
            if job.state in FINISHED_STATES:
                return AskPublic(phase="done")
            if job.state == "validating":
                if job.validator_lease_id != lease.id:
                    return AskPublic(phase="done")
                return AskPublic(phase="validate", validate_configs=self._finalists(session, job))
            search = self._search(session, job)
            candidates = search.ask(n)
            if candidates:
                now = self.store.clock()
                for candidate in candidates:
                    session.add(
                        TrialRow(
                            job_id=job.id,
                            number=candidate.trial_id,
                            lease_id=lease.id,
                            phase="search",
                            config=candidate.config,
                            state="asked",
                            asked_at=now,
                        )
                    )
                tasks = [Task(trial_id=c.trial_id, config=c.config) for c in candidates]
                return AskPublic(phase="search", tasks=tasks)
            if search.outstanding:
                return AskPublic(phase="wait")
            job.state = "validating"
            job.validator_lease_id = lease.id
            job.updated_at = self.store.clock()
            return AskPublic(phase="validate", validate_configs=self._finalists(session, job))

    def _job_of(self, token: str) -> int:
        """The id of the lease's job, read without locks so its search lock can be taken first.

        Only the fence inside the write transaction that follows decides whether the lease is live.
        """
        with self.store.reads() as session:
            job_id = session.scalar(select(LeaseRow.job_id).where(LeaseRow.token == token))
        if job_id is None:
            raise LeaseLostError("no such lease; lease a job again", field="token")
        return job_id

    def _search(self, session: Session, job: JobRow) -> Search:
        """The job's search (hold its lock); a new one is warm-started from the nearest tuned shapes."""
        found = self.studies.cached(job.id)
        if found is not None:
            return found
        assert job.chip_id is not None
        limits = chip_limits(session.get_one(ChipRow, job.chip_id))
        spec = lookup_kernel(job.kernel)
        neighbours = self.store.nearest_best(
            session, spec, dict(job.shape), dtype=job.dtype, chip_id=job.chip_id, k=WARM_START_NEIGHBOURS + 1
        )
        warm = [row.config for _, row in neighbours if row.shape_key != job.shape_key]
        search = self.studies.search(job, limits, warm[:WARM_START_NEIGHBOURS])
        self._reconcile(session, job, search)
        return search

    @staticmethod
    def _reconcile(session: Session, job: JobRow, search: Search) -> None:
        """Abandon study trials that no lease holds (asked when the server stopped, never handed out)."""
        held = set(
            session.scalars(
                select(TrialRow.number).where(TrialRow.job_id == job.id, TrialRow.state == "asked")
            )
        )
        for number in search.outstanding_ids:
            if number not in held:
                search.abandon(number, "asked but never handed out (the server stopped)")

    def _finalists(self, session: Session, job: JobRow) -> list[Config]:
        """Top configs of the search, the default and the key's current best, without repeats."""
        search = self._search(session, job)
        configs = [config for config, _ in search.best(job.validate_top)]
        if job.default_config is not None:
            configs.append(dict(job.default_config))
        best = self.store.best_row(session, _key(job))
        if best is not None:
            configs.append(dict(best.config))
        unique: list[Config] = []
        for config in configs:
            if config not in unique:
                unique.append(config)
        return unique

    # -- tell -------------------------------------------------------------------------------

    def tell(self, token: str, request: TellCreate) -> TellPublic:
        """Record outcomes of asked trials; a repeated outcome is counted once."""
        job_id = self._job_of(token)
        accepted = repeated = 0
        with self.studies.lock(job_id), self.store.sessions.begin() as session:
            lease, job = self.queue.fence(session, token)
            search = self._search(session, job) if job.state not in FINISHED_STATES else None
            now = self.store.clock()
            for index, outcome in enumerate(request.outcomes):
                trial = self._asked_trial(session, job, lease, outcome.trial_id, index)
                if trial.state != "asked":
                    repeated += 1
                    continue
                _check_outcome(outcome, index)
                self._record(job, trial, outcome, now)
                if search is not None:
                    time_ms = outcome.measurement.median_ms if outcome.measurement else None
                    search.tell(trial.number or 0, time_ms, _reason(outcome))
                accepted += 1
            job.updated_at = now
        return TellPublic(accepted=accepted, repeated=repeated)

    @staticmethod
    def _asked_trial(session: Session, job: JobRow, lease: LeaseRow, number: int, index: int) -> TrialRow:
        trial = session.scalar(select(TrialRow).where(TrialRow.job_id == job.id, TrialRow.number == number))
        if trial is None:
            raise InvalidInputError(
                f"job {job.id} has no trial {number}", field=f"outcomes[{index}].trial_id"
            )
        if trial.lease_id != lease.id and trial.state == "asked":
            raise ConflictError(
                f"trial {number} was asked under another lease", field=f"outcomes[{index}].trial_id"
            )
        return trial

    @staticmethod
    def _record(job: JobRow, trial: TrialRow, outcome: TrialOutcome, now: datetime) -> None:
        trial.told_at = now
        measurement = outcome.measurement
        if measurement is not None and outcome.error is None and outcome.invalid is None:
            trial.state = "measured"
            trial.median_ms = measurement.median_ms
            trial.p10_ms = measurement.p10_ms
            trial.p90_ms = measurement.p90_ms
            trial.min_ms = measurement.min_ms
            trial.samples = measurement.samples
            trial.pruned = measurement.pruned
            job.completed += 1
            if job.best_ms is None or measurement.median_ms < job.best_ms:
                job.best_ms = measurement.median_ms
                job.best_config = trial.config
            if trial.config == job.default_config:
                job.default_ms = measurement.median_ms
        elif outcome.invalid is not None:
            trial.state = "invalid"
            trial.reason = outcome.invalid
            job.invalid += 1
        else:
            trial.state = "failed"
            trial.reason = outcome.error
            job.failed += 1

    # -- complete, release, cancel, reap ----------------------------------------------------

    def complete(self, token: str, request: CompleteCreate) -> JobPublic:
        """Take the validation run, promote its winner if it beats the key's best, end the job."""
        job_id = self._job_of(token)
        with self.studies.lock(job_id), self.store.sessions.begin() as session:
            lease, job = self.queue.fence(session, token)
            if job.state != "validating" or job.validator_lease_id != lease.id:
                raise ConflictError(f"job {job.id} is not waiting for this lease's validation", field="token")
            expected = self._finalists(session, job)
            for index, result in enumerate(request.results):
                if result.config not in expected:
                    raise InvalidInputError(
                        "not one of the configs asked to validate", f"results[{index}].config"
                    )
            rows = self._validation_rows(session, job, lease, request)
            measured = [(row, row.median_ms) for row in rows if row.median_ms is not None]
            if not measured:
                self.queue.end(session, lease, job, "validation: no config ran correctly", failed=True)
                self.studies.forget(job.id)
                return self.store.job_public(session, job)
            winner, winner_ms = min(measured, key=lambda pair: pair[1])
            default_ms = next((ms for row, ms in measured if row.config == job.default_config), None)
            job.best_ms, job.best_config = winner_ms, winner.config
            job.default_ms = default_ms if default_ms is not None else job.default_ms
            if self._beats_incumbent(session, job, winner.config, winner_ms, measured):
                worker = self.queue.worker_of(session, lease)
                winner_row = Winner(
                    shape=job.shape,
                    config=winner.config,
                    median_ms=winner_ms,
                    default_config=job.default_config,
                    default_ms=default_ms,
                    job_id=job.id,
                    trial_id=winner.id,
                    software_id=worker.software_id,
                )
                self.store.promote(session, _key(job), winner_row)
            job.state = "done"
            job.finished_at = self.store.clock()
            self.queue.end(session, lease, job, "completed", failed=False)
            self.studies.forget(job.id)
            return self.store.job_public(session, job)

    def _validation_rows(
        self, session: Session, job: JobRow, lease: LeaseRow, request: CompleteCreate
    ) -> list[TrialRow]:
        now = self.store.clock()
        rows = []
        for result in request.results:
            m = result.measurement
            row = TrialRow(
                job_id=job.id,
                number=None,
                lease_id=lease.id,
                phase="validate",
                config=result.config,
                state="validated" if m is not None and result.error is None else "failed",
                median_ms=m.median_ms if m and result.error is None else None,
                p10_ms=m.p10_ms if m else None,
                p90_ms=m.p90_ms if m else None,
                min_ms=m.min_ms if m else None,
                samples=m.samples if m else None,
                reason=result.error,
                asked_at=now,
                told_at=now,
            )
            session.add(row)
            rows.append(row)
        session.flush()
        return rows

    def _beats_incumbent(
        self,
        session: Session,
        job: JobRow,
        config: Config,
        median_ms: float,
        measured: list[tuple[TrialRow, float]],
    ) -> bool:
        """True when the key has no best, or its best (measured in this run) is slower than the winner."""
        best = self.store.best_row(session, _key(job))
        if best is None:
            return True
        if best.config == config:
            return False
        incumbent_ms = next((ms for row, ms in measured if row.config == best.config), math.inf)
        return median_ms < incumbent_ms

    def release(self, token: str, request: ReleaseCreate) -> JobPublic:
        """End a lease by the worker's wish; its outstanding trials are asked again later."""
        job_id = self._job_of(token)
        with self.studies.lock(job_id), self.store.sessions.begin() as session:
            lease, job = self.queue.fence(session, token)
            self._abandon(session, job, lease.id, f"lease released: {request.reason}")
            self.queue.end(session, lease, job, request.reason, failed=request.failed)
            return self.store.job_public(session, job)

    def reap(self) -> int:
        """Return the jobs of expired leases to the queue and abandon their outstanding trials."""
        reaped = self.queue.reap()
        for job_id, lease_id in reaped:
            with self.studies.lock(job_id), self.store.sessions.begin() as session:
                job = session.get_one(JobRow, job_id)
                self._abandon(session, job, lease_id, "lease expired")
        return len(reaped)

    def _abandon(self, session: Session, job: JobRow, lease_id: int, reason: str) -> None:
        """Mark the lease's asked trials abandoned, in our rows and in the job's study."""
        asked = session.scalars(
            select(TrialRow).where(
                TrialRow.job_id == job.id, TrialRow.lease_id == lease_id, TrialRow.state == "asked"
            )
        ).all()
        if not asked:
            return
        search = self._search(session, job)
        for trial in asked:
            trial.state = "abandoned"
            trial.reason = reason
            trial.told_at = self.store.clock()
            if trial.number is not None and trial.number in search.outstanding_ids:
                search.abandon(trial.number, reason)

    def cancel_job(self, job_id: int) -> JobPublic:
        """Cancel a job that has not finished; its leases see ``done`` at their next ask."""
        with self.studies.lock(job_id), self.store.sessions.begin() as session:
            job = self.store.job_row(session, job_id)
            if job.state not in FINISHED_STATES:
                job.state = "cancelled"
                job.finished_at = job.updated_at = self.store.clock()
            self.studies.forget(job_id)
            return self.store.job_public(session, job)

    def cancel_sweep(self, sweep_id: int) -> None:
        """Cancel every unfinished job of a sweep."""
        sweep = self.store.sweep(sweep_id)
        for job in sweep.jobs:
            if job.state not in FINISHED_STATES:
                self.cancel_job(job.id)


def _check_outcome(outcome: TrialOutcome, index: int) -> None:
    given = [outcome.measurement is not None, outcome.invalid is not None, outcome.error is not None]
    if sum(given) != 1:
        raise InvalidInputError(
            "give exactly one of measurement, invalid or error", field=f"outcomes[{index}]"
        )


def _reason(outcome: TrialOutcome) -> str | None:
    if outcome.invalid is not None:
        return f"invalid on the worker: {outcome.invalid}"
    return outcome.error


def _worker_public(worker: WorkerRow, chip: ChipRow, software: dict[str, str | None]) -> WorkerPublic:
    return WorkerPublic(
        id=worker.id,
        name=worker.name,
        chip=chip.name,
        backends=list(worker.backends),
        software=software,
        last_seen_at=aware(worker.last_seen_at),
    )


def _key(job: JobRow) -> JobKey:
    """The key a job tunes (the job is bound to its chip)."""
    assert job.chip_id is not None
    return JobKey(job.kernel, job.kernel_version, job.shape_key, job.dtype, job.chip_id)
