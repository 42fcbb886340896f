"""``/v1/sweeps`` and ``/v1/jobs``: submit, list, show and cancel; a job's trials.

Submitting needs a ``submitter`` (or ``admin``) token; cancelling, the token that submitted
the sweep or an admin's; reading, a reader's (or none when reads are open).
"""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Header, Query

from tiletune.client.wire import (
    IDEMPOTENCY_KEY_HEADER,
    JOB_STATES,
    MAX_DB_INT,
    SWEEPS_PAGE_DEFAULT,
    SWEEPS_PAGE_MAX,
    JobPublic,
    JobState,
    SweepCreate,
    SweepPublic,
    SweepSummaryPublic,
    TrialPublic,
)
from tiletune.service.dependencies import (
    DatabaseDep,
    IdPath,
    ProtocolDep,
    ReaderDep,
    SettingsDep,
    SubmitterDep,
    SweepLimitDep,
)
from tiletune.service.errors import InvalidInputError, RateLimitedError
from tiletune.service.scheduling import jobs
from tiletune.service.views import job_public, lease_workers, sweep_public, sweep_summaries, trial_public

router = APIRouter(prefix="/v1", tags=["sweeps and jobs"])
log = logging.getLogger(__name__)

Limit = Annotated[int, Query(ge=1, le=1000)]
Offset = Annotated[int, Query(ge=0, le=MAX_DB_INT)]
SweepsLimit = Annotated[int, Query(ge=1, le=SWEEPS_PAGE_MAX)]
Before = Annotated[int | None, Query(ge=1, le=MAX_DB_INT)]


#: An ``Idempotency-Key``: 1 to 200 printable ASCII characters, no spaces.
IdempotencyKey = Annotated[
    str | None, Header(alias=IDEMPOTENCY_KEY_HEADER, min_length=1, max_length=200, pattern=r"^[!-~]+$")
]


@router.post("/sweeps", status_code=201)
def submit_sweep(
    sweep: SweepCreate,
    *,
    db: DatabaseDep,
    settings: SettingsDep,
    caller: SubmitterDep,
    limit: SweepLimitDep,
    idempotency_key: IdempotencyKey = None,
) -> SweepPublic:
    """Queue one job per (shape, dtype, chip) of the sweep; keys already tuned, or tuned by another
    live job (one live job per key: ``tuned_by`` names it), are ``skipped``.

    ``Idempotency-Key`` (optional): the same key from the same token with the same request answers
    the first sweep, as it is now, and writes nothing (a retry after a lost response makes no
    second sweep); the same key with another request is a 409. Each token submits at most
    ``TILETUNE_SWEEPS_PER_S`` sweeps a second, in bursts of ``TILETUNE_SWEEP_BURST`` (429 beyond)."""
    if not limit.allow(caller.token_id):
        raise RateLimitedError("too many sweeps from this token; try again later", limit.retry_after_s())
    planned = jobs.plan_sweep(sweep, settings.max_jobs_per_sweep, settings.max_shape_bytes)
    with db.write() as session:
        created = jobs.create_sweep(
            session, sweep, planned, db.clock(), caller.token_id, idempotency_key=idempotency_key
        )
    jobs_by_state = ", ".join(f"{count} {state}" for state, count in created.counts.items())
    log.info("sweep %d submitted by token %s: %s", created.id, caller.token_id, jobs_by_state or "no jobs")
    return created


@router.get("/sweeps")
def list_sweeps(
    db: DatabaseDep,
    _reader: ReaderDep,
    limit: SweepsLimit = SWEEPS_PAGE_DEFAULT,
    before: Before = None,
    offset: Offset = 0,
) -> list[SweepSummaryPublic]:
    """A page of sweeps, newest first, each with its jobs counted by state (not the jobs themselves:
    ``GET /v1/sweeps/{id}`` lists them).

    ``limit``: sweeps per page (default 50, at most 1000). ``before``: only sweeps older than
    that sweep id; the next page is ``before=`` the last id of this one, and a page shorter
    than ``limit`` is the last. (``offset`` skips that many more, for older clients.)
    """
    with db.read() as session:
        return sweep_summaries(session, jobs.sweep_rows(session, limit, offset, before))


@router.get("/sweeps/{sweep_id}")
def show_sweep(sweep_id: IdPath, db: DatabaseDep, _reader: ReaderDep) -> SweepPublic:
    """One sweep with its jobs."""
    with db.read() as session:
        return sweep_public(session, jobs.sweep_row(session, sweep_id))


@router.post("/sweeps/{sweep_id}/cancel")
def cancel_sweep(
    sweep_id: IdPath, db: DatabaseDep, protocol: ProtocolDep, caller: SubmitterDep
) -> SweepPublic:
    """Cancel every unfinished job of the sweep."""
    protocol.cancel_sweep(sweep_id, caller)
    with db.read() as session:
        return sweep_public(session, jobs.sweep_row(session, sweep_id))


@router.get("/jobs")
def list_jobs(
    db: DatabaseDep, _reader: ReaderDep, state: str | None = None, limit: Limit = 100, offset: Offset = 0
) -> list[JobPublic]:
    """Jobs, newest first, optionally in one ``state``."""
    if state is not None and state not in JOB_STATES:
        raise InvalidInputError(f"state must be one of {list(JOB_STATES)}, got {state!r}", field="state")
    with db.read() as session:
        rows = jobs.job_rows(session, JobState(state) if state is not None else None, limit, offset)
        return [job_public(session, job) for job in rows]


@router.get("/jobs/{job_id}")
def show_job(job_id: IdPath, db: DatabaseDep, _reader: ReaderDep) -> JobPublic:
    """One job with its progress (trials, best so far, speedup over the default)."""
    with db.read() as session:
        return job_public(session, jobs.job_row(session, job_id))


@router.post("/jobs/{job_id}/cancel")
def cancel_job(job_id: IdPath, protocol: ProtocolDep, caller: SubmitterDep) -> JobPublic:
    """Cancel a job; workers holding it are told ``done`` at their next ask."""
    return protocol.cancel_job(job_id, caller)


@router.get("/jobs/{job_id}/trials")
def job_trials(job_id: IdPath, db: DatabaseDep, _reader: ReaderDep) -> list[TrialPublic]:
    """Every trial of the job with its outcome."""
    with db.read() as session:
        workers = lease_workers(session, job_id)
        rows = jobs.trial_rows(session, job_id)
        return [trial_public(row, workers.get(row.lease_id) if row.lease_id else None) for row in rows]
