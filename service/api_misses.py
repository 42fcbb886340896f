"""What clients report: ``/v1/misses`` (the keys nobody tuned; enough reports queue tuning) and
``/v1/client-stats`` (the answers they served themselves, into the metrics)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from tiletune.client.wire import ClientStatsCreate, ClientStatsPublic, MissesCreate, MissesPublic, MissPublic
from tiletune.service.dependencies import MissesDep, MissLimitDep, ReaderDep, TokenHolderDep
from tiletune.service.errors import RateLimitedError
from tiletune.service.metrics import ServiceMetrics

router = APIRouter(prefix="/v1", tags=["misses"])

Limit = Annotated[int, Query(ge=1, le=1000)]


@router.post("/misses")
def report_misses(
    batch: MissesCreate, misses: MissesDep, caller: TokenHolderDep, limit: MissLimitDep
) -> MissesPublic:
    """Count a batch of misses (all or nothing) and queue the keys whose count reached the threshold.

    See :mod:`tiletune.service.misses` for the policy. Each token may send
    ``TILETUNE_MISS_REPORTS_PER_S`` batches a second (bursts of ``TILETUNE_MISS_REPORT_BURST``);
    beyond, 429 ``rate_limited`` with ``Retry-After`` (the client keeps the batch for later).
    """
    if not limit.allow(caller.token_id):
        raise RateLimitedError("too many miss reports from this token", limit.retry_after_s())
    return misses.report(batch)


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
    into ``tiletune_client_answers_total`` (by answer; this replica's metrics, nothing stored).

    Limited as miss reports are (``TILETUNE_MISS_REPORTS_PER_S`` a second per token, bursts of
    ``TILETUNE_MISS_REPORT_BURST``), in buckets of their own: a client's stats never use up its
    miss reports. Beyond, 429 ``rate_limited`` with ``Retry-After`` (the client keeps the counts).
    """
    if not limit.allow(("client-stats", caller.token_id)):
        raise RateLimitedError("too many client stats reports from this token", limit.retry_after_s())
    metrics: ServiceMetrics = request.app.state.services.metrics
    return ClientStatsPublic(accepted=metrics.clients_answered(stats.answers.model_dump()))
