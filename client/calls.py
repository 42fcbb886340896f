"""Every ``/v1`` call as data, how an answer is judged, and the one set of errors a call raises.

A :class:`Call` is a request (method, path, query, JSON body, deadline, cap on its answer)
with the decoder of its answer; the twins of :mod:`tiletune.client.api` send calls, nothing
here does I/O. The functions below build each call of the REST API once, for both twins.

Bounds of a call: ``timeout_s`` is the whole exchange's (connecting, sending, waiting, reading
the last byte), not one read's; ``max_bytes`` caps its answer's body as decoded (a gzip body
inflated), counted while it arrives: the call gives up past it. ``None``: the twin's defaults
(:data:`~tiletune.client.api.DEFAULT_DEADLINE_S`, :data:`MAX_ANSWER_BYTES`). The bulk export
is capped at :data:`MAX_BUNDLE_BYTES`, a lookup and the reports at :data:`MAX_SMALL_ANSWER_BYTES`.

Errors (one set, for every caller):

- :class:`ServerUnreachableError`: no answer (connection refused, DNS, timeout), or no
  complete answer by the call's deadline;
- :class:`ServerRefusedError`: an error status, with the server's ``code``, ``message`` and
  ``field`` when it sent an :class:`~tiletune.client.wire.ErrorBody`; ``status >= 500`` is
  the server's fault (worth retrying), anything below the caller's;
- :class:`LeaseLostError` (a :class:`ServerRefusedError`): 409 ``lease_lost`` — the lease
  ended; write nothing more under its token;
- :class:`UnexpectedAnswerError`: a success whose body is not the expected document (not a
  tiletune server, or one of another major version), or an answer larger than the call's cap.

Imports httpx, pydantic and the wire schemas only.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import httpx
from pydantic import BaseModel, TypeAdapter

from tiletune.client.wire import (
    IDEMPOTENCY_KEY_HEADER,
    LEASE_TOKEN_HEADER,
    REQUEST_ID_HEADER,
    AskPublic,
    ClientStatsCreate,
    ClientStatsPublic,
    CompleteCreate,
    ConfigBundle,
    ConfigsImportedPublic,
    ErrorBody,
    JobPublic,
    LeaseCreate,
    LeasePublic,
    ListedWorkerPublic,
    LookupPublic,
    MissesCreate,
    MissesPublic,
    ReleaseCreate,
    SweepCreate,
    SweepPublic,
    SweepSummaryPublic,
    TellCreate,
    TellPublic,
    TokenCreate,
    TokenCreated,
    TokenPublic,
    TrialOutcome,
    TrialPublic,
    ValidatedConfig,
    WorkerCreate,
    WorkerPublic,
)

R = TypeVar("R")
Document = TypeVar("Document", bound=BaseModel)

LEASE_LOST_CODE = "lease_lost"

#: The longest reason a release carries (the server's limit).
MAX_RELEASE_REASON = 2000

#: The most bytes (decoded) of an answer to a call that names no cap: a sweep of the server's
#: 10,000 jobs at most is about 10 MiB, a page of a listing less.
MAX_ANSWER_BYTES = 64 << 20
#: The most bytes (decoded) of a lookup's or a report's answer: a lookup answer (one entry, its
#: config, software and knob values, all bounded by the wire schemas) is a few KiB, a miss report's
#: answer (the ids of the jobs it queued, 10,000 at most) under 200 KiB.
MAX_SMALL_ANSWER_BYTES = 1 << 20
#: The most bytes (decoded) of a bulk export: a bundle entry is under 1 KiB of JSON, so this holds
#: a chip's 250,000 configs and more.
MAX_BUNDLE_BYTES = 256 << 20


class ApiError(Exception):
    """Any failure of a call to the server."""


class ServerUnreachableError(ApiError):
    """No answer from the server (connection refused, DNS, timeout)."""


class ServerRefusedError(ApiError):
    """The server answered an error status; ``status < 500`` is the caller's fault."""

    def __init__(self, path: str, status: int, error: ErrorBody | None, text: str = "") -> None:
        if error is not None:
            field = f" [field: {error.field}]" if error.field else ""
            detail = f"{error.code}: {error.message}{field} ({status} {error.code})"
        else:
            detail = f"HTTP {status}: {text[:300]}"
        super().__init__(f"the server refused {path}: {detail}")
        self.path = path
        self.status = status
        self.code = error.code if error is not None else None
        self.field = error.field if error is not None else None
        self.server_message = error.message if error is not None else text[:300]


class LeaseLostError(ServerRefusedError):
    """The lease ended (expired, taken over, job cancelled): write nothing more under its token.

    Raised for the server's 409 ``lease_lost``, and by a worker that presumes its lease lost.
    """

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(path, 409, ErrorBody(code=LEASE_LOST_CODE, message=message, field="token"))
        self.args = (message,)


class UnexpectedAnswerError(ApiError):
    """A success whose body is not the expected document."""


@dataclass(frozen=True)
class Call(Generic[R]):
    """One request and the decoder of its (successful) answer.

    ``timeout_s``: seconds the whole exchange may take; ``max_bytes``: the most bytes of its
    answer, decoded (see the module docstring; ``None``: the twin's defaults).
    """

    method: str
    path: str
    decode: Callable[[httpx.Response], R]
    params: Mapping[str, str | int | list[int]] | None = None
    body: BaseModel | None = None
    timeout_s: float | None = None
    headers: Mapping[str, str] | None = None
    max_bytes: int | None = None

    def request_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``httpx.Client.request`` for this call (each with a fresh request id:
        the server logs it, so one attempt of a call can be found in the server's log)."""
        kwargs: dict[str, Any] = {}
        headers = {**(self.headers or {}), REQUEST_ID_HEADER: uuid.uuid4().hex}
        if self.params is not None:
            kwargs["params"] = dict(self.params)
        if self.body is not None:
            kwargs["content"] = self.body.model_dump_json()
            headers["Content-Type"] = "application/json"
        kwargs["headers"] = headers
        if self.timeout_s is not None:
            kwargs["timeout"] = self.timeout_s
        return kwargs


# -- judging answers --------------------------------------------------------------------------------


def error_body(response: httpx.Response) -> ErrorBody | None:
    """The response's :class:`ErrorBody`, or ``None`` when it carries none."""
    try:
        return ErrorBody.model_validate_json(response.content)
    except ValueError:  # not JSON, or not an ErrorBody (ValidationError is a ValueError)
        return None


def checked(path: str, response: httpx.Response) -> httpx.Response:
    """``response`` if it is a success, or a ``304 Not Modified`` to a conditional request (one
    with ``If-None-Match``: its call's decoder reads it), else the error it stands for."""
    if response.is_success or (response.status_code == 304 and _conditional(response)):
        return response
    error = error_body(response)
    if response.status_code == 409 and error is not None and error.code == LEASE_LOST_CODE:
        raise LeaseLostError(error.message, path)
    raise ServerRefusedError(path, response.status_code, error, response.text)


def _conditional(response: httpx.Response) -> bool:
    try:
        return "if-none-match" in response.request.headers
    except RuntimeError:  # a response built without its request
        return False


def document(model: type[Document]) -> Callable[[httpx.Response], Document]:
    """A decoder of a ``model`` body; :class:`UnexpectedAnswerError` for anything else."""

    def decode(response: httpx.Response) -> Document:
        try:
            return model.model_validate_json(response.content)
        except ValueError:
            where = str(response.request.url)
            what = f"a tiletune {model.__name__}"
            raise UnexpectedAnswerError(
                f"{where} answered something that is not {what} (a tiletune server?)"
            ) from None

    return decode


def document_or_none(model: type[Document]) -> Callable[[httpx.Response], Document | None]:
    """As :func:`document`, but ``204 No Content`` is ``None``."""
    decode = document(model)
    return lambda response: None if response.status_code == 204 else decode(response)


def listing(model: type[Document], what: str) -> Callable[[httpx.Response], list[Document]]:
    """A decoder of a JSON list of ``model`` (``what`` names it in the error); as :func:`document`."""
    adapter = TypeAdapter(list[model])  # type: ignore[valid-type]

    def decode(response: httpx.Response) -> list[Document]:
        try:
            decoded: list[Document] = adapter.validate_json(response.content)
        except ValueError:
            where = str(response.request.url)
            raise UnexpectedAnswerError(f"{where} answered something that is not {what}") from None
        return decoded

    return decode


def nothing(_response: httpx.Response) -> None:
    """The decoder of a call whose answer body is not needed."""


# -- the calls ------------------------------------------------------------------------------------


def submit(sweep: SweepCreate) -> Call[SweepPublic]:
    """``POST /v1/sweeps`` with a fresh idempotency key, which every retry of this call repeats."""
    headers = {IDEMPOTENCY_KEY_HEADER: uuid.uuid4().hex}
    return Call("POST", "/v1/sweeps", document(SweepPublic), body=sweep, headers=headers)


def sweep(sweep_id: int) -> Call[SweepPublic]:
    """``GET /v1/sweeps/{id}``."""
    return Call("GET", f"/v1/sweeps/{sweep_id}", document(SweepPublic))


def sweeps(limit: int = 50, before: int | None = None) -> Call[list[SweepSummaryPublic]]:
    """``GET /v1/sweeps?limit=[&before=]``: a page of sweeps, newest first, their jobs counted.

    The next page: ``before=`` the last one's id; a page shorter than ``limit`` is the last.
    """
    params = {"limit": limit, **({"before": before} if before is not None else {})}
    return Call("GET", "/v1/sweeps", listing(SweepSummaryPublic, "a sweep list"), params)


def cancel_sweep(sweep_id: int) -> Call[SweepPublic]:
    """``POST /v1/sweeps/{id}/cancel`` (its submitter or an admin): every unfinished job cancelled."""
    return Call("POST", f"/v1/sweeps/{sweep_id}/cancel", document(SweepPublic))


def job(job_id: int) -> Call[JobPublic]:
    """``GET /v1/jobs/{id}``."""
    return Call("GET", f"/v1/jobs/{job_id}", document(JobPublic))


def jobs(state: str | None = None, limit: int = 100, offset: int = 0) -> Call[list[JobPublic]]:
    """``GET /v1/jobs?[state=]&limit=&offset=``: a page of jobs, newest first (``limit`` at most 1000)."""
    params: dict[str, str | int] = {"limit": limit, "offset": offset}
    if state is not None:
        params["state"] = state
    return Call("GET", "/v1/jobs", listing(JobPublic, "a job list"), params)


def cancel_job(job_id: int) -> Call[JobPublic]:
    """``POST /v1/jobs/{id}/cancel`` (its sweep's submitter or an admin); a finished job stays as it is."""
    return Call("POST", f"/v1/jobs/{job_id}/cancel", document(JobPublic))


def job_trials(job_id: int) -> Call[list[TrialPublic]]:
    """``GET /v1/jobs/{id}/trials``: every trial of the job, in the order asked."""
    return Call("GET", f"/v1/jobs/{job_id}/trials", listing(TrialPublic, "a trial list"))


def workers(limit: int = 100, seen_within_s: float | None = None) -> Call[list[ListedWorkerPublic]]:
    """``GET /v1/workers?limit=[&seen_within_s=]``: registered workers, the most recently seen first."""
    params: dict[str, str | int] = {"limit": limit}
    if seen_within_s is not None:
        params["seen_within_s"] = repr(float(seen_within_s))
    return Call("GET", "/v1/workers", listing(ListedWorkerPublic, "a worker list"), params)


def lookup(
    kernel: str,
    *,
    shape: str,
    dtype: str,
    chip: str,
    match: str,
    timeout_s: float | None = None,
    max_bytes: int = MAX_SMALL_ANSWER_BYTES,
) -> Call[LookupPublic]:
    """``GET /v1/configs/{kernel}?shape=&dtype=&chip=&match=``."""
    params = {"shape": shape, "dtype": dtype, "chip": chip, "match": match}
    path = f"/v1/configs/{kernel}"
    return Call("GET", path, document(LookupPublic), params, timeout_s=timeout_s, max_bytes=max_bytes)


def configs(
    chip: str, kernel: str | None = None, timeout_s: float | None = None, max_bytes: int = MAX_BUNDLE_BYTES
) -> Call[ConfigBundle]:
    """``GET /v1/configs?chip=[&kernel=]``: the bulk export of a chip's best configs."""
    params = {"chip": chip, **({"kernel": kernel} if kernel else {})}
    return Call(
        "GET", "/v1/configs", document(ConfigBundle), params, timeout_s=timeout_s, max_bytes=max_bytes
    )


def import_configs(bundle: ConfigBundle, force: bool = False) -> Call[ConfigsImportedPublic]:
    """``POST /v1/configs/import[?force=true]`` (admins): store a sealed bundle's entries (the server
    checks each entry and the checksum; a refusal changes nothing)."""
    params = {"force": "true"} if force else None
    return Call("POST", "/v1/configs/import", document(ConfigsImportedPublic), params, body=bundle)


#: An entity tag as RFC 9110 writes it (``"abc"``, ``W/"abc"``), or a bare token some servers send.
_ETAG = re.compile(r'(W/)?"[\x21\x23-\x7e]{0,256}"|[\x21\x23-\x2b\x2d-\x7e]{1,256}')


def usable_etag(value: str | None) -> str | None:
    """``value`` if it is an entity tag that may be sent back in ``If-None-Match``, else ``None``."""
    return value if value is not None and _ETAG.fullmatch(value) else None


@dataclass(frozen=True)
class BundleAnswer:
    """A conditional bulk export's answer: the bundle and its ``ETag``, or ``bundle`` ``None``
    when the server answered ``304 Not Modified`` (the bundle of that ETag is current)."""

    bundle: ConfigBundle | None
    etag: str | None


def configs_since(
    chip: str,
    kernel: str | None,
    timeout_s: float | None,
    etag: str | None,
    max_bytes: int = MAX_BUNDLE_BYTES,
) -> Call[BundleAnswer]:
    """``GET /v1/configs`` with ``If-None-Match: etag`` (when given): :class:`BundleAnswer`.

    The ETag of the answer is kept only if it may be sent back (:func:`usable_etag`).
    """
    decode_bundle = document(ConfigBundle)

    def decode(response: httpx.Response) -> BundleAnswer:
        if response.status_code == 304:
            return BundleAnswer(None, etag)
        return BundleAnswer(decode_bundle(response), usable_etag(response.headers.get("etag")))

    params = {"chip": chip, **({"kernel": kernel} if kernel else {})}
    sendable = usable_etag(etag)
    headers = {"If-None-Match": sendable} if sendable is not None else None
    return Call(
        "GET", "/v1/configs", decode, params, timeout_s=timeout_s, headers=headers, max_bytes=max_bytes
    )


def report_misses(
    misses: MissesCreate, timeout_s: float | None = None, max_bytes: int = MAX_SMALL_ANSWER_BYTES
) -> Call[MissesPublic]:
    """``POST /v1/misses``."""
    decode = document(MissesPublic)
    return Call("POST", "/v1/misses", decode, body=misses, timeout_s=timeout_s, max_bytes=max_bytes)


def report_client_stats(
    stats: ClientStatsCreate, timeout_s: float | None = None, max_bytes: int = MAX_SMALL_ANSWER_BYTES
) -> Call[ClientStatsPublic]:
    """``POST /v1/client-stats``: the answers a client served itself since its last report."""
    decode = document(ClientStatsPublic)
    return Call("POST", "/v1/client-stats", decode, body=stats, timeout_s=timeout_s, max_bytes=max_bytes)


def register(worker: WorkerCreate) -> Call[WorkerPublic]:
    """``POST /v1/workers``."""
    return Call("POST", "/v1/workers", document(WorkerPublic), body=worker)


def lease(worker_id: int) -> Call[LeasePublic | None]:
    """``POST /v1/leases``: a lease, or ``None`` (204) when there is no job for the worker now."""
    return Call("POST", "/v1/leases", document_or_none(LeasePublic), body=LeaseCreate(worker_id=worker_id))


def _lease(token: str) -> dict[str, str]:
    return {LEASE_TOKEN_HEADER: token}


def heartbeat(token: str) -> Call[LeasePublic]:
    """``POST /v1/lease/heartbeat`` (the lease token in its header, never in the URL)."""
    return Call("POST", "/v1/lease/heartbeat", document(LeasePublic), headers=_lease(token))


def ask(token: str, n: int, holding: Sequence[int] = ()) -> Call[AskPublic]:
    """``POST /v1/lease/ask?n=&holding=``: idempotent; the trials not in ``holding`` come back first."""
    params: dict[str, int | list[int]] = {"n": n, "holding": list(holding)} if holding else {"n": n}
    return Call("POST", "/v1/lease/ask", document(AskPublic), params=params, headers=_lease(token))


def tell(token: str, outcomes: Sequence[TrialOutcome]) -> Call[TellPublic]:
    """``POST /v1/lease/tell``; idempotent per trial, so sending it again is safe."""
    body = TellCreate(outcomes=list(outcomes))
    return Call("POST", "/v1/lease/tell", document(TellPublic), body=body, headers=_lease(token))


def complete(token: str, results: Sequence[ValidatedConfig]) -> Call[None]:
    """``POST /v1/lease/complete``."""
    body = CompleteCreate(results=list(results))
    return Call("POST", "/v1/lease/complete", nothing, body=body, headers=_lease(token))


def release(token: str, reason: str, failed: bool) -> Call[None]:
    """``POST /v1/lease/release``."""
    body = ReleaseCreate(reason=reason[:MAX_RELEASE_REASON], failed=failed)
    return Call("POST", "/v1/lease/release", nothing, body=body, headers=_lease(token))


def create_token(request: TokenCreate) -> Call[TokenCreated]:
    """``POST /v1/tokens`` (admin): a new token; the answer carries its secret, once."""
    return Call("POST", "/v1/tokens", document(TokenCreated), body=request)


def tokens() -> Call[list[TokenPublic]]:
    """``GET /v1/tokens`` (admin): every token, without secrets."""
    return Call("GET", "/v1/tokens", listing(TokenPublic, "a token list"))


def revoke_token(token_id: int) -> Call[TokenPublic]:
    """``POST /v1/tokens/{id}/revoke`` (admin)."""
    return Call("POST", f"/v1/tokens/{token_id}/revoke", document(TokenPublic))
