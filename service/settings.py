"""Server settings, read from arguments or ``TILETUNE_*`` environment variables.

Never read at import time: ``create_app(settings)`` takes them explicitly.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from tiletune.service.access.token_strength import token_weakness, weak_token_message
from tiletune.service.database import default_url

#: The longest a browser session may be allowed to last (30 days).
MAX_SESSION_S = 30 * 24 * 3600.0


class Settings(BaseSettings):
    """How the server stores, leases and limits.

    - ``db_url``: our tables (SQLite file by default; ``postgresql://...`` at scale);
    - ``lease_s``: how long a lease lives without a heartbeat; ``heartbeat_s``:
      how often workers are told to renew it;
    - ``max_lease_failures``: expired or failed leases after which a job is ``failed``;
    - ``reap_interval_s``: how often expired leases are returned to the queue;
    - ``usage_flush_s``: how often the launches per key this replica counted are stored (and
      before each re-tuning): a flush writes each key looked up since the last, so it costs the
      keys in use, not the lookups, and holds the interpreter while it writes;
    - ``max_body_bytes``: requests with larger bodies are refused (413), counted as received;
    - ``max_jobs_per_sweep``: larger sweeps are refused (counted before any job is built);
    - ``max_shape_bytes``: a shape whose bench would hold more bytes (inputs, output,
      reference) is refused;
    - ``lookup_cache_s``: how long a replica reuses a single-key lookup's answer
      when it is not an exact hit (a promotion in the same replica is seen at once; 0 turns
      the cache off);
    - ``index_check_s``: how often a replica checks the store for best configs other replicas
      changed (its exact lookups and exports reflect them within twice that; its own at once);
    - ``miss_queue_threshold``: reports of one missed key after which the server
      queues a job to tune it (0 turns demand-driven tuning off); ``miss_trials``:
      the trials of such a job (see ``tiletune.service.demand.misses``); ``miss_reports_per_s`` and
      ``miss_report_burst``: the miss reports each token may send (429 beyond; 0: no limit);
    - ``demand_jobs_per_chip_hour``: the demand budget, the most jobs misses may queue on one
      chip in any hour, counted in the store across replicas (the most missed keys first; 0
      turns demand-driven tuning off);
    - ``retune_budget``: when a worker registers software new to its chip (a torch, CANN or
      driver upgrade: the chip's best configs measured with other software turn stale), the most
      re-tuning jobs queued for that chip and change: its stale keys launched most first (server
      lookups, clients' per-key counts and misses), ``miss_trials`` each (see
      ``tiletune.service.demand.retune``; 0 turns re-tuning off);
    - ``admin_token``: the first admin token of a database without one (a deployment's secret;
      without it ``tiletune server`` makes one and shows it once);
    - ``worker_token``: a deployment's secret for its workers (their ``TILETUNE_TOKEN``): made the
      worker token ``deploy-worker`` of every chip at start unless the database has it, live or
      revoked (a revoked one is never made again; see ``tiletune.service.access.auth``). To rotate it,
      start the server with the new one, move the workers, then revoke the old;
    - ``admin_token`` and ``worker_token`` must be generated tokens, ``tt_`` and 32 or more random
      characters (``tiletune.service.access.token_strength``; placeholders such as ``CHANGE-ME`` are
      refused), and differ; empty is unset;
    - ``open_reads``: reads need no token (``None``: ``tiletune server`` opens them on a
      loopback address only; an app made in code keeps them closed);
    - ``workers_create_chips``: a worker token may register a chip nobody registered yet
      (changing an existing chip's limits is an admin's);
    - ``session_idle_s`` and ``session_max_s``: a browser's dashboard session ends when unused
      for ``session_idle_s`` and ``session_max_s`` after sign-in at the latest (see
      ``tiletune.service.dashboard.session``);
    - ``forwarded_allow_ips``: the addresses (IPs or networks, comma-separated; ``*``: any)
      whose ``X-Forwarded-Proto`` and ``X-Forwarded-For`` are believed: the TLS proxy or
      ingress in front of ``tiletune server`` (``None``: uvicorn's ``$FORWARDED_ALLOW_IPS``,
      else loopback only);
    - ``public_url``: the URL browsers reach the dashboard by (``https://tiletune.example.com``),
      where a proxy in front ends TLS: its origin is the dashboard's too (forms posted from it
      are ours) and session cookies are ``Secure`` when it is https, without believing any
      forwarded header (``None``: the request's own scheme and ``Host``);
    - ``body_timeout_s``: how long a request's body may take to arrive after its head (408 and
      the connection closed beyond; see ``tiletune.service.access.bodies``, which also caps each
      route's body under ``max_body_bytes``); ``head_timeout_s``: how long a connection may
      take to send a request's head (closed beyond; ``tiletune server`` only);
    - ``sweeps_per_s`` and ``sweep_burst``: the sweeps each token may submit (429 ``rate_limited``
      beyond; 0: no limit); a retry with the same ``Idempotency-Key`` counts too;
    - ``auth_failures_per_s`` and ``auth_failure_burst``: the failed authentications (unknown
      or revoked tokens) each client address may make (429 ``rate_limited`` beyond, before
      the token is looked up; 0: no limit);
    - ``otel``: OpenTelemetry traces of the requests, their SQL and httpx calls
      (``tiletune.service.tracing``; the ``otel`` extra): ``None`` (unset) traces when
      ``$OTEL_EXPORTER_OTLP_ENDPOINT`` is set, ``True`` always, ``False`` never.
    """

    # No setting's value in an error: the tokens and the database URL's password are secrets.
    model_config = SettingsConfigDict(env_prefix="TILETUNE_", hide_input_in_errors=True)

    db_url: str = Field(default_factory=default_url)
    lease_s: float = Field(default=60.0, gt=0)
    heartbeat_s: float = Field(default=5.0, gt=0)
    max_lease_failures: int = Field(default=3, ge=1)
    reap_interval_s: float = Field(default=5.0, gt=0)
    usage_flush_s: float = Field(default=60.0, gt=0)
    max_body_bytes: int = Field(default=8 * 1024 * 1024, gt=0)
    max_jobs_per_sweep: int = Field(default=10_000, ge=1)
    max_shape_bytes: int = Field(default=8 * 2**30, ge=1)
    lookup_cache_s: float = Field(default=2.0, ge=0)
    index_check_s: float = Field(default=0.5, gt=0, le=3600)
    miss_queue_threshold: int = Field(default=3, ge=0)
    miss_trials: int = Field(default=40, ge=1, le=10_000)
    miss_reports_per_s: float = Field(default=1.0, ge=0)
    miss_report_burst: int = Field(default=30, ge=1)
    demand_jobs_per_chip_hour: int = Field(default=20, ge=0, le=100_000)
    retune_budget: int = Field(default=20, ge=0, le=10_000)
    admin_token: SecretStr | None = None
    worker_token: SecretStr | None = None
    open_reads: bool | None = None
    workers_create_chips: bool = True
    session_idle_s: float = Field(default=2 * 3600.0, gt=0, le=MAX_SESSION_S)
    session_max_s: float = Field(default=12 * 3600.0, gt=0, le=MAX_SESSION_S)
    forwarded_allow_ips: str | None = Field(default=None, max_length=4000)
    public_url: str | None = Field(default=None, max_length=2000)
    body_timeout_s: float = Field(default=30.0, gt=0, le=3600)
    head_timeout_s: float = Field(default=10.0, gt=0, le=3600)
    sweeps_per_s: float = Field(default=1.0, ge=0)
    sweep_burst: int = Field(default=60, ge=1)
    auth_failures_per_s: float = Field(default=1.0, ge=0)
    auth_failure_burst: int = Field(default=60, ge=1)
    otel: bool | None = None

    @field_validator("admin_token", "worker_token")
    @classmethod
    def _generated(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        """A generated token (see ``tiletune.service.access.token_strength``), never quoted when
        refused; empty is unset; the worker's must not be the admin's."""
        if value is None or not value.get_secret_value():
            return None
        weakness = token_weakness(value.get_secret_value())
        if weakness is not None:
            raise ValueError(weak_token_message(weakness))
        if info.field_name == "worker_token" and info.data.get("admin_token") == value:
            raise ValueError("must differ from the admin token (workers act as admins)")
        return value

    @field_validator("forwarded_allow_ips")
    @classmethod
    def _addresses(cls, value: str | None) -> str | None:
        """Each entry an IP address or network, or ``*`` alone (uvicorn ignores others silently)."""
        if value is None or value.strip() == "*":
            return value
        for entry in value.split(","):
            try:
                ipaddress.ip_network(entry.strip())
            except ValueError:
                raise ValueError(
                    f"{entry.strip()!r} is not an IP address or network (e.g. 10.0.0.0/8, or * for any)"
                ) from None
        return value

    @field_validator("public_url")
    @classmethod
    def _an_origin(cls, value: str | None) -> str | None:
        """``http(s)://host[:port]``, a trailing ``/`` allowed; no path, query or user. Empty is unset."""
        if value is None or not value.strip():
            return None
        try:
            parts = urlsplit(value.strip())
            parts.port  # noqa: B018 - raises on a port that is not a number
        except ValueError:
            raise ValueError("is not a URL (e.g. https://tiletune.example.com)") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                "must be an http:// or https:// URL with a host (e.g. https://tiletune.example.com)"
            )
        if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username or parts.password:
            raise ValueError("must be the origin alone: scheme, host and port (no path, query or user)")
        return f"{parts.scheme}://{parts.netloc}"
