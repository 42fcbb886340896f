"""``/v1/sweeps`` and ``/v1/jobs``: submit, list, show and cancel; a job's trials."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from tiletune.client.wire import JOB_STATES, JobPublic, SweepCreate, SweepPublic, TrialPublic
from tiletune.service.dependencies import StoreDep, TuningDep
from tiletune.service.errors import InvalidInputError

router = APIRouter(prefix="/v1", tags=["sweeps and jobs"])

Limit = Annotated[int, Query(ge=1, le=1000)]
Offset = Annotated[int, Query(ge=0)]


@router.post("/sweeps", status_code=201)
def submit_sweep(sweep: SweepCreate, store: StoreDep, request: Request) -> SweepPublic:
    """Queue one job per (shape, dtype, chip) of the sweep; keys already tuned are ``skipped``."""
    return store.submit(sweep, max_jobs=request.app.state.services.settings.max_jobs_per_sweep)


@router.get("/sweeps")
def list_sweeps(store: StoreDep, limit: Limit = 50, offset: Offset = 0) -> list[SweepPublic]:
    """Sweeps, newest first, with their jobs' states and progress."""
    return store.sweeps(limit, offset)


@router.get("/sweeps/{sweep_id}")
def show_sweep(sweep_id: int, store: StoreDep) -> SweepPublic:
    """One sweep with its jobs."""
    return store.sweep(sweep_id)


@router.post("/sweeps/{sweep_id}/cancel")
def cancel_sweep(sweep_id: int, store: StoreDep, tuning: TuningDep) -> SweepPublic:
    """Cancel every unfinished job of the sweep."""
    tuning.cancel_sweep(sweep_id)
    return store.sweep(sweep_id)


@router.get("/jobs")
def list_jobs(
    store: StoreDep, state: str | None = None, limit: Limit = 100, offset: Offset = 0
) -> list[JobPublic]:
    """Jobs, newest first, optionally in one ``state``."""
    if state is not None and state not in JOB_STATES:
        raise InvalidInputError(f"state must be one of {list(JOB_STATES)}, got {state!r}", field="state")
    return store.jobs(state, limit, offset)


@router.get("/jobs/{job_id}")
def show_job(job_id: int, store: StoreDep) -> JobPublic:
    """One job with its progress (trials, best so far, speedup over the default)."""
    return store.job(job_id)


@router.post("/jobs/{job_id}/cancel")
def cancel_job(job_id: int, tuning: TuningDep) -> JobPublic:
    """Cancel a job; workers holding it are told ``done`` at their next ask."""
    return tuning.cancel_job(job_id)


@router.get("/jobs/{job_id}/trials")
def job_trials(job_id: int, store: StoreDep) -> list[TrialPublic]:
    """Every trial of the job with its outcome."""
    return store.trials(job_id)
