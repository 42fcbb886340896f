"""Errors the service raises on purpose, each with a stable ``code`` and an HTTP status.

The API turns every :class:`ServiceError` into ``{"code", "message", "field"}``
(``tiletune.client.wire.ErrorBody``); nothing a caller sent in bad faith or by
mistake reaches them as a 500.
"""

from __future__ import annotations

import math


class ServiceError(Exception):
    """Base: ``code`` (stable, machine-readable), ``message`` (human), ``field`` (if one is to blame)."""

    status = 400
    code = "bad_request"

    def __init__(self, message: str, field: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        if code is not None:
            self.code = code


class InvalidInputError(ServiceError):
    """The request is well-formed JSON but names something impossible (422)."""

    status = 422
    code = "invalid"


class NotFoundError(ServiceError):
    """No such sweep, job, worker, chip or config (404)."""

    status = 404
    code = "not_found"


class ConflictError(ServiceError):
    """The request clashes with the current state (409)."""

    status = 409
    code = "conflict"


class LeaseLostError(ConflictError):
    """The lease behind a worker's write expired, ended, or never existed: nothing was changed."""

    code = "lease_lost"


class UnauthorizedError(ServiceError):
    """No token, or one that is unknown or revoked (401; the answer names the Bearer scheme)."""

    status = 401
    code = "unauthorized"


class ForbiddenError(ServiceError):
    """The token is valid, but its role may not do this, or the thing is another's (403)."""

    status = 403
    code = "forbidden"


class UnavailableError(ServiceError):
    """The database cannot be reached now; ``retry_after_s`` says when to try again (503)."""

    status = 503
    code = "database_unavailable"

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class StorageFullError(UnavailableError):
    """The database's disk is full: nothing was written (507); ``retry_after_s`` as a 503's."""

    status = 507
    code = "storage_full"


class RateLimitedError(ServiceError):
    """The caller sent more than its share; ``retry_after_s`` says when to try again (429)."""

    status = 429
    code = "rate_limited"

    def __init__(self, message: str, retry_after_s: float, field: str | None = None) -> None:
        super().__init__(message, field)
        self.retry_after_s = retry_after_s


def error_headers(error: ServiceError) -> dict[str, str]:
    """The headers an error's answer carries: ``WWW-Authenticate: Bearer`` on a 401, ``Retry-After``
    (whole seconds, at least 1) on a 429, a 503 or a 507."""
    if isinstance(error, UnauthorizedError):
        return {"WWW-Authenticate": "Bearer"}
    if isinstance(error, RateLimitedError | UnavailableError):
        return {"Retry-After": str(max(1, math.ceil(error.retry_after_s)))}
    return {}
