"""FastAPI dependencies as ``Annotated`` aliases: the routes' way to reach the services and the caller.

The caller's identity comes from ``Authorization: Bearer`` (:mod:`tiletune.service.access.auth`);
``ReaderDep`` lets anonymous callers through when reads are open, the role dependencies
never do. The dependencies are ``async``, so resolving them costs no thread-pool hop; a token
the replica verified recently is known without the database, any other is verified in the
thread pool (never a blocking query on the event loop), failures limited per client address
(:func:`authenticate`).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from tiletune.client.wire import MAX_DB_INT, Role
from tiletune.service.access.auth import ANONYMOUS, Identity, Tokens, require
from tiletune.service.access.ratelimit import RateLimiter, address_key
from tiletune.service.database import Database
from tiletune.service.demand.misses import Misses
from tiletune.service.errors import RateLimitedError, UnauthorizedError
from tiletune.service.reads import Reads
from tiletune.service.scheduling.protocol import WorkerProtocol
from tiletune.service.settings import Settings

_bearer = HTTPBearer(auto_error=False, description="a tiletune token (`tiletune token create`)")


async def _db(request: Request) -> Database:
    db: Database = request.app.state.services.db
    return db


async def _protocol(request: Request) -> WorkerProtocol:
    protocol: WorkerProtocol = request.app.state.services.protocol
    return protocol


def reads_of(request: Request) -> Reads:
    """The app's read side (a function, not a dependency: the lookups resolve as few as they can)."""
    reads: Reads = request.app.state.services.reads
    return reads


def settings_of(request: Request) -> Settings:
    """The app's settings (a function, for code that has the request but no dependency of its own)."""
    settings: Settings = request.app.state.services.settings
    return settings


async def _reads(request: Request) -> Reads:
    return reads_of(request)


async def _misses(request: Request) -> Misses:
    misses: Misses = request.app.state.services.misses
    return misses


async def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.services.settings
    return settings


async def _tokens(request: Request) -> Tokens:
    tokens: Tokens = request.app.state.services.tokens
    return tokens


async def _miss_limit(request: Request) -> RateLimiter:
    limit: RateLimiter = request.app.state.services.miss_limit
    return limit


async def _sweep_limit(request: Request) -> RateLimiter:
    limit: RateLimiter = request.app.state.services.sweep_limit
    return limit


async def authenticate(tokens: Tokens, failures: RateLimiter, secret: str, address: str) -> Identity:
    """The identity of a presented token, failed authentications limited per client address.

    A token verified recently is known without the database. Any other takes one of its
    address's failures (:func:`~tiletune.service.access.ratelimit.address_key`;
    ``TILETUNE_AUTH_FAILURES_PER_S``, bursts of ``TILETUNE_AUTH_FAILURE_BURST``) before it is
    looked up, given back unless it is unknown or revoked (401), so concurrent guesses cannot
    pass the limit together. An address that has spent its failures gets 429 ``rate_limited``
    without a query, except for a token among the replica's live digests
    (:meth:`~tiletune.service.access.auth.Tokens.may_be_live`): a valid token is never refused for
    what others guessed from its address.
    """
    remembered = tokens.remembered(secret)
    if remembered is not None:
        return remembered
    key = address_key(address)
    if not failures.allow(key):
        if await run_in_threadpool(tokens.may_be_live, secret):
            return await run_in_threadpool(tokens.identify, secret)
        raise RateLimitedError(
            "too many failed authentications from this address; try again later",
            failures.retry_after_s(),
            field="authorization",
        )
    failed = False
    try:
        return await run_in_threadpool(tokens.identify, secret)
    except UnauthorizedError:
        failed = True
        raise
    finally:
        if not failed:
            failures.refund(key)


async def authenticate_request(request: Request, secret: str) -> Identity:
    """:func:`authenticate` for a request of the app (its tokens, its limit, its client's address)."""
    services = request.app.state.services
    address = request.client.host if request.client is not None else ""
    return await authenticate(services.tokens, services.auth_failures, secret, address)


async def _caller(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> Identity:
    if credentials is None:
        return ANONYMOUS
    tokens: Tokens = request.app.state.services.tokens
    remembered = tokens.remembered(credentials.credentials)  # no database on the lookups' path
    if remembered is not None:
        return remembered
    return await authenticate_request(request, credentials.credentials)


CallerDep = Annotated[Identity, Depends(_caller)]


async def _reader(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> Identity:
    caller = await _caller(request, credentials)  # called, not depended on: one level less per read
    if caller.anonymous and request.app.state.services.settings.open_reads:
        return caller
    return require(caller, Role.READER)


async def _submitter(caller: CallerDep) -> Identity:
    return require(caller, Role.SUBMITTER)


async def _worker(caller: CallerDep) -> Identity:
    return require(caller, Role.WORKER)


async def _admin(caller: CallerDep) -> Identity:
    return require(caller, Role.ADMIN)


async def _token_holder(caller: CallerDep) -> Identity:
    return require(caller, Role.READER)


DatabaseDep = Annotated[Database, Depends(_db)]
ProtocolDep = Annotated[WorkerProtocol, Depends(_protocol)]
MissesDep = Annotated[Misses, Depends(_misses)]
#: The replica's read side (the index of best configs, the caches): for pages, not the lookups.
ReadsDep = Annotated[Reads, Depends(_reads)]
SettingsDep = Annotated[Settings, Depends(_settings)]
TokensDep = Annotated[Tokens, Depends(_tokens)]
MissLimitDep = Annotated[RateLimiter, Depends(_miss_limit)]
SweepLimitDep = Annotated[RateLimiter, Depends(_sweep_limit)]
#: Anyone when reads are open, else any valid token.
ReaderDep = Annotated[Identity, Depends(_reader)]
#: Any valid token, even when reads are open (writes such as miss reports).
TokenHolderDep = Annotated[Identity, Depends(_token_holder)]
SubmitterDep = Annotated[Identity, Depends(_submitter)]
WorkerDep = Annotated[Identity, Depends(_worker)]
AdminDep = Annotated[Identity, Depends(_admin)]
#: An id in a path: a positive integer the databases hold.
IdPath = Annotated[int, Path(ge=1, le=MAX_DB_INT)]
