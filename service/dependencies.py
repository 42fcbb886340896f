"""FastAPI dependencies as ``Annotated`` aliases: the routes' way to reach the services."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from tiletune.service.database import Database
from tiletune.service.lookup import LookupCache
from tiletune.service.misses import Misses
from tiletune.service.protocol import WorkerProtocol
from tiletune.service.settings import Settings


def _db(request: Request) -> Database:
    db: Database = request.app.state.services.db
    return db


def _protocol(request: Request) -> WorkerProtocol:
    protocol: WorkerProtocol = request.app.state.services.protocol
    return protocol


def _lookup_cache(request: Request) -> LookupCache:
    cache: LookupCache = request.app.state.services.lookup_cache
    return cache


def _misses(request: Request) -> Misses:
    misses: Misses = request.app.state.services.misses
    return misses


def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.services.settings
    return settings


DatabaseDep = Annotated[Database, Depends(_db)]
LookupCacheDep = Annotated[LookupCache, Depends(_lookup_cache)]
ProtocolDep = Annotated[WorkerProtocol, Depends(_protocol)]
MissesDep = Annotated[Misses, Depends(_misses)]
SettingsDep = Annotated[Settings, Depends(_settings)]
