"""``/v1/misses``: clients report the keys nobody tuned; enough reports queue tuning."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from tiletune.client.wire import MissesCreate, MissesPublic, MissPublic
from tiletune.service.dependencies import MissesDep, ReaderDep, TokenHolderDep

router = APIRouter(prefix="/v1", tags=["misses"])

Limit = Annotated[int, Query(ge=1, le=1000)]


@router.post("/misses")
def report_misses(batch: MissesCreate, misses: MissesDep, _caller: TokenHolderDep) -> MissesPublic:
    """Count a batch of misses (all or nothing) and queue the keys whose count reached the threshold.

    See :mod:`tiletune.service.misses` for the policy.
    """
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
