"""A person's choice of misses to tune (the dashboard's misses page): one sweep, whatever demand's
policy and budget say.

:func:`queue_selected` queues one sweep named ``misses`` with one job per chosen key, skipping
keys of an old kernel version and keys with a live job on their chip; each queued job's id is
kept on its key (replacing an earlier, finished one). Its jobs name no backend: each runs the
implementation its first lease's worker prefers (:mod:`tiletune.service.scheduling.backends`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from tiletune.client.wire import JobState, SweepCreate, SweepKernel
from tiletune.kernels import Shape, all_declarations
from tiletune.service.demand.miss_keys import live_job
from tiletune.service.errors import InvalidInputError
from tiletune.service.fleet import chip_by_name
from tiletune.service.models import MissRow
from tiletune.service.scheduling import jobs

#: The name of the sweeps a person queues from chosen misses.
SELECTED_SWEEP = "misses"


@dataclass(frozen=True)
class SelectedQueued:
    """What :func:`queue_selected` did: the sweep (``None`` when nothing was left to queue),
    each queued key's ``(miss id, job id, job state)``, and the misses it left alone."""

    sweep_id: int | None
    jobs: list[tuple[int, int, str]]
    live: list[int]
    stale: list[int]


@dataclass
class _Choice:
    """The chosen misses sorted: those to queue with their planned jobs, those left alone."""

    chosen: list[tuple[MissRow, jobs.PlannedJob]]
    live: list[int]
    stale: list[int]


def queue_selected(
    session: Session,
    miss_ids: list[int],
    *,
    trials: int,
    now: datetime,
    owner_token_id: int | None,
    max_jobs: int,
    max_shape_bytes: int = jobs.DEFAULT_MAX_SHAPE_BYTES,
) -> SelectedQueued:
    """Queue one sweep (``misses``, of token ``owner_token_id``) tuning the misses ``miss_ids``.

    One job per miss (its kernel, shape, dtype and ``chips=[its chip]``, ``trials``, no backend),
    planned and born by the sweeps' rules (a key already tuned on its chip's newest software is
    born ``skipped``). Left alone: misses of a kernel version that is no longer the registry's
    (``stale``: a kernel no longer registered too) and misses whose key has a live job on its
    chip (``live``). A queued job's id is kept on its miss. Runs in the caller's (write)
    transaction; an unknown id is an :class:`InvalidInputError` naming ``miss``, and so is a
    choice one sweep cannot hold (over ``max_jobs`` jobs, 64 kernels or 64 chips).
    """
    ids = list(dict.fromkeys(miss_ids))
    # locked in id order (PostgreSQL): a concurrent choice of the same misses waits, then sees the job
    chosen_rows = select(MissRow).where(MissRow.id.in_(ids)).order_by(MissRow.id).with_for_update()
    rows = {row.id: row for row in session.scalars(chosen_rows)}
    unknown = [miss_id for miss_id in ids if miss_id not in rows]
    if unknown:
        raise InvalidInputError(f"no miss {unknown[0]}", field="miss")
    if len(ids) > max_jobs:
        raise InvalidInputError(f"{len(ids)} misses make {len(ids)} jobs; at most {max_jobs}", "miss")
    choice = _sort(session, [rows[miss_id] for miss_id in ids], trials, max_shape_bytes)
    if not choice.chosen:
        return SelectedQueued(None, [], choice.live, choice.stale)
    planned = [job for _, job in choice.chosen]
    created = jobs.create_sweep(session, _selected_request(planned, trials), planned, now, owner_token_id)
    queued = []
    for (row, _), job in zip(choice.chosen, created.jobs, strict=True):
        if job.state == JobState.QUEUED:
            row.job_id = job.id
        queued.append((row.id, job.id, str(job.state)))
    return SelectedQueued(created.id, queued, choice.live, choice.stale)


def _sort(session: Session, rows: list[MissRow], trials: int, max_shape_bytes: int) -> _Choice:
    """``rows`` (in the order chosen) sorted into jobs to queue, ``live`` and ``stale`` misses."""
    choice = _Choice([], [], [])
    for row in rows:
        spec = all_declarations().get(row.kernel)
        if spec is None or row.kernel_version != spec.version:
            choice.stale.append(row.id)
            continue
        chip = chip_by_name(session, row.chip_name)
        if live_job(session, row, chip.id if chip is not None else row.chip_id):
            choice.live.append(row.id)
            continue
        single = SweepCreate(
            kernel=row.kernel, shapes=[row.shape], dtypes=[row.dtype], chips=[row.chip_name], trials=trials
        )
        choice.chosen.append((row, jobs.plan_sweep(single, 1, max_shape_bytes)[0]))
    return choice


def _selected_request(planned: list[jobs.PlannedJob], trials: int) -> SweepCreate:
    """The sweep request kept for reference with a sweep of chosen misses: its kernels, shapes,
    dtypes and chips (the jobs are the chosen keys, not their product), no backend."""
    shapes: dict[str, list[Shape]] = {}
    for job in planned:
        found = shapes.setdefault(job.spec.name, [])
        if job.shape not in found:
            found.append(job.shape)
    try:
        return SweepCreate(
            name=SELECTED_SWEEP,
            kernels=[SweepKernel(kernel=name, shapes=listed) for name, listed in shapes.items()],
            dtypes=list(dict.fromkeys(job.dtype for job in planned)),
            chips=list(dict.fromkeys(job.chip_target for job in planned)),
            trials=trials,
        )
    except ValidationError as error:
        raise InvalidInputError(
            f"one sweep cannot hold these misses ({error.errors()[0]['msg']}); choose fewer", field="miss"
        ) from None
