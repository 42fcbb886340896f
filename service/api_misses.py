"""``/v1/misses``: clients report the keys nobody tuned; enough reports queue tuning."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from tiletune.client.wire import MissesCreate, MissesPublic, MissPublic
from tiletune.service.dependencies import MissesDep, MissLimitDep, ReaderDep, TokenHolderDep
from tiletune.service.errors import RateLimitedError

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
