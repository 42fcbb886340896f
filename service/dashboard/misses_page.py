"""``/misses``: the keys clients asked for that nobody tuned, and the button that queues them.

- The table lists the misses of the kernels' current versions (see :mod:`tiletune.service.demand.misses`),
  highest count first: kernel, shape, dtype, chip, how often it was missed, the last answer
  (``nearest`` or ``default``), the best time if the key is tuned on its chip by now, the job
  queued for it and its state, first and last report. ``show=untuned`` (the default) keeps the
  keys without a best config on their chip; ``show=all`` lists the tuned ones too. Filters
  ``kernel`` and ``chip``; sorted, counted and paged in SQL; downloads as CSV or JSON.
- A viewer with the submitter role (an admin holds it too) sees a checkbox per key without a
  live job and the form "Queue a sweep for the selected": ``POST /misses/queue`` with ``csrf``,
  ``miss`` (repeated: miss ids, at most :data:`MAX_SELECTED`), ``trials`` (default: the
  server's ``miss_trials``) and the page's filters. It queues one sweep with one job per
  chosen key (:func:`tiletune.service.demand.selected_misses.queue_selected`, one write transaction) and sends
  the browser back to the page, filters kept, with ``queued=SWEEP`` (and ``live``, ``stale``:
  how many chosen misses it left alone) where a notice lists the new jobs. A reader sees neither the
  checkboxes nor the form, and a reader's POST is refused (403), as is one without the page's
  CSRF token or from another site.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import RedirectResponse, Response
from sqlalchemy import ColumnElement, Select, and_, func, or_, select
from sqlalchemy.orm import Session

from tiletune.client.wire import LIVE_JOB_STATES, MAX_DB_INT, Role
from tiletune.kernels import all_declarations
from tiletune.service.access.auth import require
from tiletune.service.dashboard.render import render, shape_url
from tiletune.service.dashboard.session import ViewerDep, read_form
from tiletune.service.dashboard.tables import (
    MAX_PER_PAGE,
    Column,
    Format,
    Link,
    Paging,
    Table,
    download,
    paging,
    sort_key,
)
from tiletune.service.database import aware
from tiletune.service.demand.selected_misses import SelectedQueued, queue_selected
from tiletune.service.dependencies import DatabaseDep, SettingsDep
from tiletune.service.errors import InvalidInputError
from tiletune.service.models import BestConfigRow, ChipRow, JobRow, MissRow
from tiletune.service.specs import lookup_kernel

router = APIRouter(include_in_schema=False)

#: The most misses one POST may queue (a page's rows at most).
MAX_SELECTED = MAX_PER_PAGE
#: The most trials a queued job may have (the sweeps' own bound).
MAX_TRIALS = 10_000
#: The most chips the filter lists.
CHIPS_LISTED = 200
#: The most jobs the notice of a queued sweep lists.
NOTICE_JOBS = MAX_SELECTED

Show = Literal["untuned", "all"]
SORTS = {
    "count": MissRow.count,
    "last_seen_at": MissRow.last_seen_at,
    "first_seen_at": MissRow.first_seen_at,
    "kernel": MissRow.kernel,
}
COLUMNS = [
    Column("id", "Miss", "number"),
    Column("kernel", "Kernel", sortable=True),
    Column("shape", "Shape"),
    Column("dtype", "Dtype"),
    Column("chip", "Chip"),
    Column("count", "Count", "number", sortable=True),
    Column("last_match", "Last answer"),
    Column("best_ms", "Tuned", "ms"),
    Column("job_id", "Job", "number"),
    Column("job_state", "Job state"),
    Column("first_seen_at", "First seen", "when", sortable=True),
    Column("last_seen_at", "Last seen", "when", sortable=True),
]


def _current_versions(kernel: str | None) -> ColumnElement[bool]:
    """Misses of the registry's versions of the kernels (of ``kernel`` alone when given)."""
    specs = [lookup_kernel(kernel)] if kernel else list(all_declarations().values())
    return or_(*(and_(MissRow.kernel == s.name, MissRow.kernel_version == s.version) for s in specs))


def _misses_query(kernel: str | None, chip: str | None, show: Show) -> Select[*tuple[Any, ...]]:
    """The misses the filters keep, each with its best time on its chip and its job's state."""
    query = (
        select(
            MissRow.id,
            MissRow.kernel,
            MissRow.shape_key,
            MissRow.dtype,
            MissRow.chip_name,
            MissRow.count,
            MissRow.last_match,
            MissRow.job_id,
            MissRow.first_seen_at,
            MissRow.last_seen_at,
            JobRow.state,
            BestConfigRow.median_ms,
        )
        .outerjoin(JobRow, JobRow.id == MissRow.job_id)
        .outerjoin(ChipRow, ChipRow.name == MissRow.chip_name)
        .outerjoin(
            BestConfigRow,
            and_(
                BestConfigRow.chip_id == ChipRow.id,
                BestConfigRow.kernel == MissRow.kernel,
                BestConfigRow.kernel_version == MissRow.kernel_version,
                BestConfigRow.shape_key == MissRow.shape_key,
                BestConfigRow.dtype == MissRow.dtype,
            ),
        )
        .where(_current_versions(kernel))
    )
    if chip:
        query = query.where(MissRow.chip_name == chip)
    if show == "untuned":
        query = query.where(BestConfigRow.id.is_(None))
    return query


def misses_table(
    session: Session, *, kernel: str | None, chip: str | None, show: Show, sort: str | None, page: Paging
) -> Table:
    """One page of the misses the filters keep (see the module docstring), counted in SQL."""
    name, descending = sort_key(sort, list(SORTS), "-count")
    query = _misses_query(kernel, chip, show)
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    column = SORTS[name]
    order: list[Any] = [column.desc() if descending else column.asc()]
    if name != "last_seen_at":
        order.append(MissRow.last_seen_at.desc())
    rows = session.execute(query.order_by(*order, MissRow.id).limit(page.per_page).offset(page.offset)).all()
    table_rows = []
    for miss_id, name_, shape_key, dtype, chip_name, count, match, job_id, first, last, state, best in rows:
        table_rows.append(
            {
                "id": miss_id,
                "kernel": Link(name_, f"/kernels/{name_}"),
                "shape": Link(shape_key, shape_url(name_, shape_key, dtype))
                if best is not None
                else shape_key,
                "dtype": dtype,
                "chip": chip_name,
                "count": count,
                "last_match": match,
                "best_ms": best,
                "job_id": job_id,
                "job_state": state,
                "first_seen_at": aware(first),
                "last_seen_at": aware(last),
                "_queueable": state not in LIVE_JOB_STATES,
            }
        )
    empty = "no client has missed an untuned key" if show == "untuned" else "no client has missed a key"
    return Table("misses", COLUMNS, table_rows, total, page, sort=name, descending=descending, empty=empty)


def missed_chips(session: Session) -> list[str]:
    """The chips clients reported misses on (for the filter)."""
    query = select(MissRow.chip_name).distinct().order_by(MissRow.chip_name).limit(CHIPS_LISTED)
    return list(session.scalars(query))


def queued_jobs(session: Session, sweep_id: int) -> list[dict[str, Any]]:
    """The jobs of sweep ``sweep_id`` for the notice (first :data:`NOTICE_JOBS`)."""
    rows = session.execute(
        select(JobRow.id, JobRow.kernel, JobRow.shape_key, JobRow.dtype, JobRow.chip_target, JobRow.state)
        .where(JobRow.sweep_id == sweep_id)
        .order_by(JobRow.id)
        .limit(NOTICE_JOBS)
    ).all()
    keys = ("id", "kernel", "shape_key", "dtype", "chip", "state")
    return [dict(zip(keys, row, strict=True)) for row in rows]


KernelQuery = Annotated[str | None, Query(max_length=64, description="only this kernel")]
ChipQuery = Annotated[str | None, Query(max_length=200, description="only misses on this chip")]
IdQuery = Annotated[int | None, Query(ge=1, le=MAX_DB_INT)]
CountQuery = Annotated[int, Query(ge=0, le=MAX_SELECTED)]


@router.get("/misses")
def misses_page(
    request: Request,
    viewer: ViewerDep,
    *,
    db: DatabaseDep,
    settings: SettingsDep,
    page: Annotated[Paging, Depends(paging)],
    kernel: KernelQuery = None,
    chip: ChipQuery = None,
    show: Show = "untuned",
    sort: Annotated[str | None, Query(max_length=40)] = None,
    queued: IdQuery = None,
    live: CountQuery = 0,
    stale: CountQuery = 0,
    format: Format = "html",
) -> Response:
    """The misses page (see the module docstring); ``format=csv|json`` downloads the table."""
    with db.read() as session:
        table = misses_table(
            session, kernel=kernel or None, chip=chip or None, show=show, sort=sort, page=page
        )
        if format != "html":
            return download(table, format)
        chips = missed_chips(session)
        notice_jobs = queued_jobs(session, queued) if queued is not None else []
    context = {
        "table": table,
        "kernels": sorted(all_declarations()),
        "chips": chips,
        "kernel": kernel or "",
        "chip": chip or "",
        "show": show,
        "may_queue": viewer.may(Role.SUBMITTER),
        "max_trials": MAX_TRIALS,
        "default_trials": settings.miss_trials,
        "queued": queued,
        "notice_jobs": notice_jobs,
        "live": live,
        "stale": stale,
    }
    return render(request, viewer, "misses.html", context)


def _miss_ids(values: list[str]) -> list[int]:
    """The posted ``miss`` fields as ids; 422 naming ``miss`` when none, too many, or not ids."""
    if not values:
        raise InvalidInputError("select at least one miss", field="miss")
    if len(values) > MAX_SELECTED:
        raise InvalidInputError(f"select at most {MAX_SELECTED} misses at once", field="miss")
    ids = []
    for value in values:
        if not value.isdigit() or not 1 <= int(value) <= MAX_DB_INT:
            raise InvalidInputError(f"a miss is named by its id, not {value[:40]!r}", field="miss")
        ids.append(int(value))
    return ids


def _trials(values: list[str], default: int) -> int:
    """The posted ``trials`` (``default`` when absent or blank); 422 naming ``trials`` when out of bounds."""
    text = values[0].strip() if values else ""
    if not text:
        return default
    if not text.isdigit() or not 1 <= int(text) <= MAX_TRIALS:
        raise InvalidInputError(f"trials must be a whole number from 1 to {MAX_TRIALS}", field="trials")
    return int(text)


#: The page's filters a posted form carries back (hidden fields), so the notice keeps the view.
KEPT_FILTERS = ("kernel", "chip", "show")


def _notice_url(result: SelectedQueued, fields: dict[str, list[str]]) -> str:
    """``/misses`` with the notice of ``result`` and the filters the form came from."""
    params: list[tuple[str, object]] = [
        (name, fields[name][0][:200]) for name in KEPT_FILTERS if (fields.get(name) or [""])[0]
    ]
    params += [
        (name, value)
        for name, value in (
            ("queued", result.sweep_id),
            ("live", len(result.live)),
            ("stale", len(result.stale)),
        )
        if value
    ]
    return "/misses" + (f"?{urlencode(params)}" if params else "")


@router.post("/misses/queue")
async def queue_misses(
    request: Request, viewer: ViewerDep, db: DatabaseDep, settings: SettingsDep
) -> Response:
    """Queue one sweep for the posted misses (submitter role); back to ``/misses`` with a notice."""
    fields = await read_form(request, viewer)
    identity = require(viewer.identity, Role.SUBMITTER)
    ids = _miss_ids(fields.get("miss", []))
    trials = _trials(fields.get("trials", []), settings.miss_trials)

    def queue() -> SelectedQueued:
        with db.write() as session:
            return queue_selected(
                session,
                ids,
                trials=trials,
                now=db.clock(),
                owner_token_id=identity.token_id,
                max_jobs=settings.max_jobs_per_sweep,
                max_shape_bytes=settings.max_shape_bytes,
            )

    result = await run_in_threadpool(queue)
    return RedirectResponse(_notice_url(result, fields), status_code=303)
