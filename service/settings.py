"""Server settings, read from arguments or ``TILETUNE_*`` environment variables.

Never read at import time: ``create_app(settings)`` takes them explicitly.
"""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from tiletune.service.database import default_url


class Settings(BaseSettings):
    """How the server stores, leases and limits.

    - ``db_url``: our tables (SQLite file by default; ``postgresql://...`` at scale);
    - ``lease_s``: how long a lease lives without a heartbeat; ``heartbeat_s``:
      how often workers are told to renew it;
    - ``max_lease_failures``: expired or failed leases after which a job is ``failed``;
    - ``reap_interval_s``: how often expired leases are returned to the queue;
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
      the trials of such a job (see ``tiletune.service.misses``); ``miss_reports_per_s`` and
      ``miss_report_burst``: the miss reports each token may send (429 beyond; 0: no limit);
    - ``admin_token``: the first admin token of an empty database (a deployment's secret;
      without it ``tiletune server`` makes one and shows it once);
    - ``open_reads``: reads need no token (``None``: ``tiletune server`` opens them on a
      loopback address only; an app made in code keeps them closed);
    - ``workers_create_chips``: a worker token may register a chip nobody registered yet
      (changing an existing chip's limits is an admin's).
    """

    model_config = SettingsConfigDict(env_prefix="TILETUNE_")

    db_url: str = Field(default_factory=default_url)
    lease_s: float = Field(default=60.0, gt=0)
    heartbeat_s: float = Field(default=5.0, gt=0)
    max_lease_failures: int = Field(default=3, ge=1)
    reap_interval_s: float = Field(default=5.0, gt=0)
    max_body_bytes: int = Field(default=8 * 1024 * 1024, gt=0)
    max_jobs_per_sweep: int = Field(default=10_000, ge=1)
    max_shape_bytes: int = Field(default=8 * 2**30, ge=1)
    lookup_cache_s: float = Field(default=2.0, ge=0)
    index_check_s: float = Field(default=0.5, gt=0, le=3600)
    miss_queue_threshold: int = Field(default=3, ge=0)
    miss_trials: int = Field(default=40, ge=1, le=10_000)
    miss_reports_per_s: float = Field(default=1.0, ge=0)
    miss_report_burst: int = Field(default=30, ge=1)
    admin_token: SecretStr | None = None
    open_reads: bool | None = None
    workers_create_chips: bool = True
