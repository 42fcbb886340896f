"""FastAPI dependencies as ``Annotated`` aliases: the routes' way to reach the services."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from tiletune.service.lookup import LookupCache
from tiletune.service.misses import Misses
from tiletune.service.store import Store
from tiletune.service.tuning import Tuning


def _store(request: Request) -> Store:
    store: Store = request.app.state.services.store
    return store


def _tuning(request: Request) -> Tuning:
    tuning: Tuning = request.app.state.services.tuning
    return tuning


def _lookup_cache(request: Request) -> LookupCache:
    cache: LookupCache = request.app.state.services.lookup_cache
    return cache


def _misses(request: Request) -> Misses:
    misses: Misses = request.app.state.services.misses
    return misses


StoreDep = Annotated[Store, Depends(_store)]
LookupCacheDep = Annotated[LookupCache, Depends(_lookup_cache)]
TuningDep = Annotated[Tuning, Depends(_tuning)]
MissesDep = Annotated[Misses, Depends(_misses)]
