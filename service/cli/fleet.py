"""The service's sweeps, jobs and workers from the command line: ``sweeps``, ``jobs`` and ``workers``.

- ``sweeps list [--state S] [--limit N]``: sweeps, newest first, their jobs counted by state;
  ``sweeps show ID``: one sweep and its jobs; ``sweeps cancel ID``: cancel its unfinished jobs.
- ``jobs list [--sweep ID] [--state S] [--kernel K] [--limit N]``: jobs, newest first;
  ``jobs show ID [--trials]``: one job's key, budget and progress (and every trial);
  ``jobs cancel ID``: cancel one job (a finished job stays as it is; the command says so).
- ``workers list [--seen-within S] [--limit N]``: registered workers, the most recently seen
  first, with the jobs each holds a lease on now.

Cancelling needs the token that submitted the sweep or an admin's; the rest a reader's (or
none when the server's reads are open). ``--json`` prints the server's documents: a listing
as ``{"sweeps": [...]}`` (``jobs``, ``workers``), one sweep or job as itself (``jobs show
--trials`` adds ``trials``). Filters the server does not take (a sweep's state, a job's kernel)
are applied here, page by page, until ``--limit`` rows match or the list ends.
Light: the REST client and the wire schemas only, so these run on the base install.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import TypeVar

from tiletune.client import calls
from tiletune.client.api import ServiceApi
from tiletune.client.wire import (
    JOB_STATES,
    LIVE_JOB_STATES,
    SWEEPS_PAGE_MAX,
    WORKERS_PAGE_DEFAULT,
    WORKERS_PAGE_MAX,
    JobPublic,
    SweepState,
    SweepSummaryPublic,
)
from tiletune.service.cli.options import (
    BadInputError,
    Commands,
    add_remote_options,
    emit,
    note,
    service_api,
)
from tiletune.service.cli.text import (
    job_text,
    jobs_table,
    sweep_text,
    sweeps_table,
    trials_table,
    workers_table,
)

#: Rows ``list`` prints unless ``--limit`` says otherwise.
DEFAULT_LIMIT = 50
#: The most rows one ``list`` prints.
MAX_LIMIT = 10_000
#: Jobs the server answers per page (its most).
JOBS_PAGE = 1000
SWEEP_STATES = tuple(state.value for state in SweepState)

Row = TypeVar("Row")


def _positive(name: str, value: int | float | None, most: float) -> None:
    """:class:`BadInputError` naming ``name`` unless ``value`` is none or in ``(0, most]``."""
    if value is not None and not 0 < value <= most:
        raise BadInputError(name, f"must be a number in (0, {most:g}], got {value:g}")


# -- sweeps -----------------------------------------------------------------------------------------


def _sweep_pages(api: ServiceApi) -> Iterator[SweepSummaryPublic]:
    """Every sweep, newest first, a page at a time (``before=`` the last id of the previous page)."""
    before: int | None = None
    while True:
        page = api.send(calls.sweeps(SWEEPS_PAGE_MAX, before))
        yield from page
        if len(page) < SWEEPS_PAGE_MAX:
            return
        before = page[-1].id


def _listed_sweeps(api: ServiceApi, state: str | None, limit: int) -> list[SweepSummaryPublic]:
    if state is None:
        return api.send(calls.sweeps(limit)) if limit <= SWEEPS_PAGE_MAX else _first(_sweep_pages(api), limit)
    return _first((sweep for sweep in _sweep_pages(api) if sweep.state == state), limit)


def _first(rows: Iterator[Row], limit: int) -> list[Row]:
    """The first ``limit`` of ``rows`` (reading no further)."""
    kept: list[Row] = []
    if limit <= 0:
        return kept
    for row in rows:
        kept.append(row)
        if len(kept) == limit:
            break
    return kept


def cmd_sweeps(args: argparse.Namespace) -> None:
    """``sweeps list|show|cancel``."""
    with service_api(args) as api:
        if args.action == "list":
            _positive("limit", args.limit, MAX_LIMIT)
            listed = _listed_sweeps(api, args.state, args.limit)
            document = {"sweeps": [sweep.model_dump(mode="json") for sweep in listed]}
            emit(args, document, sweeps_table(listed))
            return
        sweep = api.send(calls.sweep(args.id))
        if args.action == "cancel":
            ended = sweep.state == SweepState.FINISHED
            sweep = sweep if ended else api.send(calls.cancel_sweep(args.id))
            if not args.json:
                done = "had already finished" if ended else "cancelled: its unfinished jobs"
                note("sweeps", f"sweep {sweep.id} {done}")
        emit(args, sweep.model_dump(mode="json"), sweep_text(sweep))


# -- jobs -------------------------------------------------------------------------------------------


def _job_pages(api: ServiceApi, state: str | None) -> Iterator[JobPublic]:
    """Every job (in ``state``), newest first, a page at a time; a job seen twice (new jobs move
    the pages along while they are read) is given once."""
    seen: set[int] = set()
    offset = 0
    while True:
        page = api.send(calls.jobs(state, JOBS_PAGE, offset))
        for job in page:
            if job.id not in seen:
                seen.add(job.id)
                yield job
        if len(page) < JOBS_PAGE:
            return
        offset += len(page)


def _listed_jobs(api: ServiceApi, args: argparse.Namespace) -> list[JobPublic]:
    def wanted(job: JobPublic) -> bool:
        return (args.state is None or job.state == args.state) and (
            args.kernel is None or job.kernel == args.kernel
        )

    if args.sweep is not None:
        of_sweep = sorted(api.send(calls.sweep(args.sweep)).jobs, key=lambda job: job.id, reverse=True)
        return [job for job in of_sweep if wanted(job)][: args.limit]
    if args.kernel is None and args.limit <= JOBS_PAGE:
        return api.send(calls.jobs(args.state, args.limit))
    return _first((job for job in _job_pages(api, args.state) if wanted(job)), args.limit)


def cmd_jobs(args: argparse.Namespace) -> None:
    """``jobs list|show|cancel``."""
    with service_api(args) as api:
        if args.action == "list":
            _positive("limit", args.limit, MAX_LIMIT)
            listed = _listed_jobs(api, args)
            emit(args, {"jobs": [job.model_dump(mode="json") for job in listed]}, jobs_table(listed))
            return
        job = api.send(calls.job(args.id))
        if args.action == "cancel":
            ended = job.state not in LIVE_JOB_STATES
            job = job if ended else api.send(calls.cancel_job(args.id))
            if not args.json:
                note("jobs", f"job {job.id} " + (f"had already ended ({job.state})" if ended else job.state))
            emit(args, job.model_dump(mode="json"), job_text(job))
            return
        document = job.model_dump(mode="json")
        text = job_text(job)
        if args.trials:
            trials = api.send(calls.job_trials(args.id))
            document["trials"] = [trial.model_dump(mode="json") for trial in trials]
            text = f"{text}\n\n{trials_table(trials)}"
        emit(args, document, text)


# -- workers ----------------------------------------------------------------------------------------


def cmd_workers(args: argparse.Namespace) -> None:
    """``workers list``."""
    _positive("limit", args.limit, WORKERS_PAGE_MAX)
    _positive("seen-within", args.seen_within, 366 * 24 * 3600)
    with service_api(args) as api:
        listed = api.send(calls.workers(args.limit, args.seen_within))
    emit(args, {"workers": [worker.model_dump(mode="json") for worker in listed]}, workers_table(listed))


# -- parsers ----------------------------------------------------------------------------------------


def add_sweeps_parser(commands: Commands) -> None:
    """The ``sweeps`` subcommand and its actions."""
    sweeps = commands.add_parser(
        "sweeps",
        help="list, show or cancel the server's sweeps",
        description="The server's sweeps: list them (newest first, jobs counted by state), show one "
        "with its jobs, or cancel its unfinished jobs (the token that submitted it, or an admin's).",
    )
    actions = sweeps.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="sweeps, newest first, their jobs counted by state")
    listing.add_argument("--state", choices=SWEEP_STATES, help="only sweeps in this state")
    listing.add_argument(
        "--limit", type=int, default=DEFAULT_LIMIT, help=f"the most sweeps listed (default {DEFAULT_LIMIT})"
    )
    show = actions.add_parser("show", help="one sweep and its jobs")
    cancel = actions.add_parser("cancel", help="cancel every unfinished job of a sweep")
    for parser in (show, cancel):
        parser.add_argument("id", type=int, help="the sweep's id (see `tiletune sweeps list`)")
    add_remote_options(listing, show, cancel)
    sweeps.set_defaults(handler=cmd_sweeps)


def add_jobs_parser(commands: Commands) -> None:
    """The ``jobs`` subcommand and its actions."""
    jobs = commands.add_parser(
        "jobs",
        help="list, show or cancel the server's jobs",
        description="The server's jobs (one per kernel, shape, dtype and chip of a sweep): list them "
        "(newest first), show one with its progress (--trials: every trial), or cancel one (the "
        "token that submitted its sweep, or an admin's; workers holding it stop at their next ask).",
    )
    actions = jobs.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="jobs, newest first")
    listing.add_argument("--sweep", type=int, metavar="ID", help="only the jobs of this sweep")
    listing.add_argument("--state", choices=JOB_STATES, help="only jobs in this state")
    listing.add_argument("--kernel", help="only jobs of this kernel")
    listing.add_argument(
        "--limit", type=int, default=DEFAULT_LIMIT, help=f"the most jobs listed (default {DEFAULT_LIMIT})"
    )
    show = actions.add_parser("show", help="one job: its key, budget and progress")
    show.add_argument("--trials", action="store_true", help="also every trial of the job, in the order asked")
    cancel = actions.add_parser("cancel", help="cancel one job")
    for parser in (show, cancel):
        parser.add_argument("id", type=int, help="the job's id (see `tiletune jobs list`)")
    add_remote_options(listing, show, cancel)
    jobs.set_defaults(handler=cmd_jobs)


def add_workers_parser(commands: Commands) -> None:
    """The ``workers`` subcommand and its action."""
    workers = commands.add_parser(
        "workers",
        help="list the server's workers",
        description="The workers registered with the server, the most recently seen first, with their "
        "chip, backends and the jobs each holds a lease on now. Every start of a worker process "
        "registers anew: --seen-within keeps the live fleet.",
    )
    actions = workers.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="workers, the most recently seen first")
    listing.add_argument(
        "--seen-within",
        type=float,
        metavar="SECONDS",
        help="only workers seen (registered, leased, heartbeat) within this many seconds",
    )
    listing.add_argument(
        "--limit",
        type=int,
        default=WORKERS_PAGE_DEFAULT,
        help=f"the most workers listed (default {WORKERS_PAGE_DEFAULT}, at most {WORKERS_PAGE_MAX})",
    )
    add_remote_options(listing)
    workers.set_defaults(handler=cmd_workers)
