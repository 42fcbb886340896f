"""``/jobs/{id}``: one job, live while it runs (the jobs list is :mod:`.jobs_list`).

- ``/jobs/{id}``: the job's header (kernel, shape, dtype, chip, backend, strategy, sweep),
  its progress (trials told / budget, an ETA while it runs), four charts of its measured
  search trials (:mod:`.job_charts`), its invalid and failed trials with their reasons, the
  ten best trials and the final interleaved validation table. Downloads: ``table=failures``,
  ``validation``, ``top`` or ``trials`` (every trial of the job).
- ``/jobs/{id}/live``: the page's live part (``templates/job_live.html``) as an htmx fragment.
  While the job is live (:data:`~tiletune.client.wire.LIVE_JOB_STATES`) the fragment polls
  itself every 2 s; once it ends, the fragment comes back without the trigger and polling
  stops. The chart divs are kept across swaps (``hx-preserve``); the swapped-in figure scripts
  are what ``dashboard.js`` redraws them from.

The job page reads its trials with one query of the columns it needs (tuples, no ORM rows),
and builds every figure and table from them in one pass.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tiletune.client.wire import ANY_BACKEND, LIVE_JOB_STATES
from tiletune.service.dashboard.job_charts import (
    CHART_IDS,
    TrialTuple,
    eta_seconds,
    format_duration,
    job_figures,
)
from tiletune.service.dashboard.pages import job_chip
from tiletune.service.dashboard.render import render, shape_url, speedup
from tiletune.service.dashboard.session import ViewerDep
from tiletune.service.dashboard.tables import Column, Format, Table, download, pick
from tiletune.service.database import aware
from tiletune.service.dependencies import DatabaseDep, IdPath
from tiletune.service.errors import NotFoundError
from tiletune.service.models import ChipRow, JobRow, TrialRow

router = APIRouter(include_in_schema=False)

#: Rows of the failures table shown on the page (the download holds all of them).
FAILURES_SHOWN = 100
TOP = 10
LIVE_STATES = frozenset(state.value for state in LIVE_JOB_STATES)
Filter = Annotated[str | None, Query(max_length=200)]

_HEADER_COLUMNS = (
    JobRow.id,
    JobRow.sweep_id,
    JobRow.kernel,
    JobRow.kernel_version,
    JobRow.shape_key,
    JobRow.dtype,
    job_chip,
    func.coalesce(JobRow.backend, ANY_BACKEND).label("backend"),
    JobRow.strategy,
    JobRow.state,
    JobRow.trials,
    JobRow.completed,
    JobRow.invalid,
    JobRow.failed,
    JobRow.best_ms,
    JobRow.best_config,
    JobRow.default_ms,
    JobRow.default_config,
    JobRow.failure_reasons,
    JobRow.tuned_by_job_id,
    JobRow.confirmation,
    JobRow.created_at,
    JobRow.updated_at,
    JobRow.finished_at,
    JobRow.search_seq,
)
#: What moves whenever the live part would show something new (a trial asked or told, a state).
_VERSION_COLUMNS = (JobRow.search_seq, JobRow.state, JobRow.updated_at)
_TRIAL_COLUMNS = (
    TrialRow.number,
    TrialRow.phase,
    TrialRow.config,
    TrialRow.state,
    TrialRow.median_ms,
    TrialRow.p10_ms,
    TrialRow.p90_ms,
    TrialRow.samples,
    TrialRow.reason,
    TrialRow.told_at,
    TrialRow.conditions,
)


#: The columns of the ``trials`` download; the page's trial tables show some of them.
_TRIAL_TABLE_COLUMNS = (
    Column("number", "Trial", "number"),
    Column("phase", "Phase"),
    Column("state", "State"),
    Column("config", "Config", "config"),
    Column("median_ms", "Median", "ms"),
    Column("p10_ms", "p10", "ms"),
    Column("p90_ms", "p90", "ms"),
    Column("samples", "Samples", "number"),
    Column("reason", "Reason"),
    Column("told_at", "Told", "when"),
    Column("conditions", "Conditions"),
)
_TRIAL_TABLE_COLUMN = {column.key: column for column in _TRIAL_TABLE_COLUMNS}


def _trial_columns(*keys: str) -> list[Column]:
    """The columns of :data:`_TRIAL_TABLE_COLUMNS` with these keys, in this order."""
    return [_TRIAL_TABLE_COLUMN[key] for key in keys]


def _row(trial: TrialTuple) -> dict[str, Any]:
    told_at = aware(trial.told_at) if trial.told_at is not None else None
    return {**trial._asdict(), "told_at": told_at, "conditions": conditions_text(trial.conditions)}


def conditions_text(conditions: Mapping[str, Any] | None) -> str | None:
    """A trial's conditions in a cell: ``performance · load 1.20 · 2,600 MHz`` on a CPU,
    ``1,755/1,980 MHz · 61 °C`` on an accelerator, then ``repeated 2×`` and ``low clock`` when
    the clock check took it again or flagged it; None when its worker sent none."""
    if not conditions:
        return None
    parts: list[str] = []
    clock, rated = conditions.get("clock_mhz"), conditions.get("max_clock_mhz")
    if conditions.get("device_kind") == "cpu":
        parts.append(conditions.get("governor") or "governor unknown")
        if conditions.get("load_1m") is not None:
            parts.append(f"load {conditions['load_1m']:.2f}")
        if conditions.get("cpu_mhz") is not None:
            parts.append(f"{conditions['cpu_mhz']:,.0f} MHz")
    elif clock is not None:
        parts.append(f"{clock:,.0f}/{rated:,.0f} MHz" if rated is not None else f"{clock:,.0f} MHz")
    else:
        parts.append("clock unknown")
    if conditions.get("temperature_c") is not None:
        parts.append(f"{conditions['temperature_c']:.0f} °C")
    if conditions.get("clock_repeats"):
        parts.append(f"repeated {conditions['clock_repeats']}×")
    if conditions.get("low_clock"):
        parts.append("low clock")
    return " · ".join(parts)


def _trial_tables(
    trials: Sequence[TrialTuple], default_ms: float | None, all_trials: bool
) -> dict[str, Table]:
    """The failures, validation and top tables of one job, and the download-only ``trials``.

    ``trials`` holds every trial when ``all_trials`` (its download asks for it), else no row:
    a page never turns thousands of trials into table rows it does not show.
    """
    failures = [_row(t) for t in trials if t.state in ("failed", "invalid")]
    validation = [
        _row(t)
        for t in sorted(
            (t for t in trials if t.phase == "validate"),
            key=lambda t: (t.median_ms is None, t.median_ms or 0.0),
        )
    ]
    measured = [
        t for t in trials if t.phase == "search" and t.state == "measured" and t.median_ms is not None
    ]
    top = [
        {**_row(t), "speedup": speedup(default_ms, t.median_ms)}
        for t in sorted(measured, key=lambda t: t.median_ms or 0.0)[:TOP]
    ]
    return {
        "failures": Table(
            "failures",
            _trial_columns("number", "phase", "state", "config", "reason", "told_at"),
            failures,
            empty="no trial failed or was invalid",
        ),
        "validation": Table(
            "validation",
            _trial_columns(
                "config", "state", "median_ms", "p10_ms", "p90_ms", "samples", "reason", "conditions"
            ),
            validation,
            empty="not validated yet: the best configs are re-measured, interleaved, when the search ends",
        ),
        "top": Table(
            "top",
            [
                *_trial_columns("number", "config", "median_ms", "p10_ms", "p90_ms"),
                Column("speedup", "vs default", "speedup"),
                _TRIAL_TABLE_COLUMN["conditions"],
            ],
            top,
            empty="no trial measured yet",
        ),
        "trials": Table(
            "trials", list(_TRIAL_TABLE_COLUMNS), [_row(t) for t in trials] if all_trials else []
        ),
    }


def job_context(session: Session, job_id: int, all_trials: bool = False) -> dict[str, Any]:
    """Everything the job page and its live fragment show, from two queries (see :func:`_trial_tables`)."""
    header = session.execute(
        select(*_HEADER_COLUMNS).outerjoin(ChipRow, ChipRow.id == JobRow.chip_id).where(JobRow.id == job_id)
    ).one_or_none()
    if header is None:
        raise NotFoundError(f"no job {job_id}", field="job_id")
    job = header._asdict()
    job["version"] = _version(job["search_seq"], job["state"], job["updated_at"])
    rows = session.execute(select(*_TRIAL_COLUMNS).where(TrialRow.job_id == job_id).order_by(TrialRow.id))
    trials = [TrialTuple._make(row) for row in rows]
    told = [t.told_at for t in trials if t.phase == "search" and t.told_at is not None]
    done = job["completed"] + job["invalid"] + job["failed"]
    live = job["state"] in LIVE_STATES
    figures = job_figures(trials, job["default_ms"])
    tables = _trial_tables(trials, job["default_ms"], all_trials)
    shown_failures = dataclasses.replace(tables["failures"], rows=tables["failures"].rows[:FAILURES_SHOWN])
    return {
        "job": job,
        "done": done,
        "percent": min(100.0, 100.0 * done / job["trials"]) if job["trials"] else 100.0,
        "eta": format_duration(eta_seconds(told, done, job["trials"])) if job["state"] == "running" else None,
        "live": live,
        "speedup": speedup(job["default_ms"], job["best_ms"]),
        "charts": CHART_IDS,
        "figures": figures.figures,
        "heatmap_knobs": figures.heatmap_knobs,
        "heatmap_note": figures.note,
        "tables": tables,
        "failures": shown_failures,
        "failures_total": len(tables["failures"].rows),
        "shape_url": shape_url(job["kernel"], job["shape_key"], job["dtype"]),
    }


@router.get("/jobs/{job_id}")
def job_page(
    request: Request,
    job_id: IdPath,
    *,
    viewer: ViewerDep,
    db: DatabaseDep,
    format: Format = "html",
    table: str | None = None,
) -> Response:
    """One job's page (see the module docstring); ``format=csv|json`` downloads a table."""
    with db.read() as session:
        context = job_context(session, job_id, all_trials=format != "html" and table == "trials")
    if format != "html":
        return download(pick(list(context["tables"].values()), table), format)
    return render(request, viewer, "job.html", context)


def _version(search_seq: int, state: str, updated_at: Any) -> str:
    """The job's version as the live part polls with it (``seen``)."""
    return f"{search_seq}.{state}.{aware(updated_at).timestamp():.6f}"


SeenQuery = Annotated[str | None, Query(max_length=100, description="the version the page shows")]


@router.get("/jobs/{job_id}/live")
def job_live(
    request: Request, job_id: IdPath, *, viewer: ViewerDep, db: DatabaseDep, seen: SeenQuery = None
) -> Response:
    """The job page's live part: progress, figure data and tables (polls itself while live).

    The fragment polls with ``seen``, the job's version it shows: while the job has not moved
    since, the answer is ``204 No Content`` (one row read; htmx swaps nothing and polls on).
    Its links (the tables' downloads) are the job page's, not the fragment's.
    """
    with db.read() as session:
        if seen is not None:
            current = session.execute(select(*_VERSION_COLUMNS).where(JobRow.id == job_id)).one_or_none()
            if current is not None and _version(*current) == seen:
                return Response(status_code=204)
        context = job_context(session, job_id)
    context["url_with"] = lambda **changes: _page_url(f"/jobs/{job_id}", changes)
    return render(request, viewer, "job_live.html", context)


def _page_url(path: str, changes: dict[str, object]) -> str:
    query = urlencode({name: str(value) for name, value in changes.items() if value is not None})
    return path + (f"?{query}" if query else "")
