"""What clients report: ``/v1/misses`` (the keys nobody tuned; enough reports queue tuning) and
``/v1/client-stats`` (the answers they served themselves, into the metrics)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.exceptions import RequestValidationError
from pydantic import SkipValidation, ValidationError

from tiletune.client.wire import ClientStatsCreate, ClientStatsPublic, MissesCreate, MissesPublic, MissPublic
from tiletune.service.dependencies import MissesDep, MissLimitDep, ReaderDep, TokenHolderDep
from tiletune.service.errors import RateLimitedError
from tiletune.service.metrics import ServiceMetrics

router = APIRouter(prefix="/v1", tags=["misses"])

Limit = Annotated[int, Query(ge=1, le=1000)]


#: A miss report's body as the route takes it: documented as :class:`MissesCreate`, checked against
#: it off the event loop (:func:`_checked`; 10,000 entries cost ~0.1 s of the interpreter).
RawMisses = Annotated[MissesCreate, SkipValidation]


@router.post("/misses")
async def report_misses(
    batch: RawMisses, misses: MissesDep, caller: TokenHolderDep, limit: MissLimitDep
) -> MissesPublic:
    """Count a batch of misses (checked whole: a bad entry changes nothing) and queue, within the
    demand budget (``TILETUNE_DEMAND_JOBS_PER_CHIP_HOUR``), the most missed keys past the threshold.

    See :mod:`tiletune.service.demand.misses` for the policy. Each token may send
    ``TILETUNE_MISS_REPORTS_PER_S`` batches a second (bursts of ``TILETUNE_MISS_REPORT_BURST``);
    beyond, 429 ``rate_limited`` with ``Retry-After`` (the client keeps the batch for later).
    The batch is checked and counted off the event loop, where the replica writes its misses.
    """
    if not limit.allow(caller.token_id):
        raise RateLimitedError("too many miss reports from this token", limit.retry_after_s())
    return await misses.off_loop(lambda: misses.report(_checked(batch)))


def _checked(raw: object) -> MissesCreate:
    """``raw`` (the parsed JSON body) as a :class:`MissesCreate`; else the 422 FastAPI's own check
    gives (``invalid``, naming the first field at fault: ``misses[3].shape.n``)."""
    try:
        return MissesCreate.model_validate(raw)
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        raise RequestValidationError([{**first, "loc": ("body", *first["loc"])}]) from None


@router.get("/misses")
def list_misses(
    misses: MissesDep,
    _reader: ReaderDep,
    chip: str | None = None,
    kernel: str | None = None,
    limit: Limit = 100,
) -> list[MissPublic]:
    """Missed keys of the kernels' current versions, highest count first, with their demand job."""
    return misses.misses(chip, kernel, limit)


@router.post("/client-stats")
async def report_client_stats(
    stats: ClientStatsCreate, request: Request, caller: TokenHolderDep, limit: MissLimitDep
) -> ClientStatsPublic:
    """Count the answers a client served from its own caches and defaults since its last report
    into ``tiletune_client_answers_total`` (by answer; this replica's metrics). Each count is at
    most ``MAX_REPORTED_ANSWERS`` (10^8) a report: beyond, 422 naming it, and nothing is counted.
    The optional ``keys`` (launches of its most launched keys, at most 100) are added to the
    chip's launches per key, which re-tuning ranks stale keys by; entries naming a kernel, shape
    or dtype this server does not know are passed over (``keys`` in the answer: those counted).

    Limited as miss reports are (``TILETUNE_MISS_REPORTS_PER_S`` a second per token, bursts of
    ``TILETUNE_MISS_REPORT_BURST``), in buckets of their own: a client's stats never use up its
    miss reports. Beyond, 429 ``rate_limited`` with ``Retry-After`` (the client keeps the counts).
    """
    if not limit.allow(("client-stats", caller.token_id)):
        raise RateLimitedError("too many client stats reports from this token", limit.retry_after_s())
    services = request.app.state.services
    metrics: ServiceMetrics = services.metrics
    counted = services.reads.usage.count_reported(stats.chip, stats.keys) if stats.keys else 0
    return ClientStatsPublic(accepted=metrics.clients_answered(stats.answers.model_dump()), keys=counted)
