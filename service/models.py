"""SQLAlchemy 2.x ORM rows of the service's own tables (Optuna's live apart).

Rows end in ``Row``; the wire schemas (``tiletune.client.wire``) are separate.
Every trial is kept; history is derived from promotions. Times are stored as
timezone-aware UTC datetimes taken from the store's injected clock.

Tables:

- ``chips`` (name, kind, limits) and ``software`` (fingerprints seen per chip);
- ``workers`` (a registered worker process: chip, backends, software);
- ``sweeps`` (what a user submitted) and ``jobs`` (one per kernel, shape,
  dtype, chip target; the unit of leasing, owning one Optuna study);
- ``leases`` (a worker's claim on a job, fenced by its token);
- ``trials`` (every config asked for a job, with its outcome);
- ``best_configs`` (the promoted winner per kernel, version, shape, dtype,
  chip) and ``promotions`` (every promotion, for history);
- ``misses`` (keys clients answered with ``nearest`` or ``default``: how
  often, and the demand job queued for them; see ``tiletune.service.demand.misses``);
- ``key_usage`` (launches per key and chip: server lookups and clients' per-key counts; see
  ``tiletune.service.demand.key_usage``), ``retune_plans`` and ``retunes`` (stale keys queued for
  re-tuning after a software change; see ``tiletune.service.demand.retune``);
- ``browser_sessions`` (a signed-in browser: its session id's digest and the token that
  signed in; see ``tiletune.service.dashboard.session``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from tiletune.client.wire import LIVE_JOB_STATES

#: Constraint names are fixed so migrations (and SQLite's batch mode) can refer to them.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

JsonDict = dict[str, Any]

#: The partial unique index that holds one live job per key (``jobs``).
LIVE_KEY_INDEX = "uq_jobs_live_key"
#: The SQL of "the job is live" (:data:`~tiletune.client.wire.LIVE_JOB_STATES`).
LIVE_STATE_SQL = "state IN ({})".format(", ".join(f"'{state.value}'" for state in LIVE_JOB_STATES))


class Base(DeclarativeBase):
    """Declarative base of every service table."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        datetime: DateTime(timezone=True),
        JsonDict: JSON,
        list[str]: JSON,
    }


class TokenRow(Base):
    """A bearer token: its role and name; only a SHA-256 digest of the secret is stored.

    ``chip_name``: the one chip a worker token registers and leases for, named when it was
    created or set by its first registration (then fixed); ``*``: every chip; ``None`` for
    other roles.
    """

    __tablename__ = "tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    role: Mapped[str] = mapped_column(String(16))
    digest: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime]
    revoked_at: Mapped[datetime | None]
    chip_name: Mapped[str | None] = mapped_column(String(200))


class BrowserSessionRow(Base):
    """A browser's dashboard session: the SHA-256 digest of its random id, never the id itself.

    It acts as the token ``token_id`` that signed in, while that token is not revoked, until
    ``expires_at`` and while it was seen within the idle limit (``last_seen_at``); sign-out
    deletes it.
    """

    __tablename__ = "browser_sessions"

    id: Mapped[int] = mapped_column(primary_key=True)
    digest: Mapped[str] = mapped_column(String(64), unique=True)
    token_id: Mapped[int] = mapped_column(ForeignKey("tokens.id"), index=True)
    created_at: Mapped[datetime]
    last_seen_at: Mapped[datetime]
    expires_at: Mapped[datetime]


class ChipRow(Base):
    """A chip workers run on: its registered name, kind and the limits constraints use."""

    __tablename__ = "chips"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    kind: Mapped[str] = mapped_column(String(16))
    local_memory_bytes: Mapped[int] = mapped_column(Integer)
    max_buffer_num: Mapped[int] = mapped_column(Integer)
    alignment_bytes: Mapped[int] = mapped_column(Integer)
    #: The cores its workers report (NULL: not reported), which native kernels' spaces run up to.
    cores: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]


class SoftwareRow(Base):
    """A software fingerprint (torch, triton, torch_npu, CANN versions) seen on a chip."""

    __tablename__ = "software"
    __table_args__ = (UniqueConstraint("chip_id", "fingerprint"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    chip_id: Mapped[int] = mapped_column(ForeignKey("chips.id"))
    #: The fingerprint as canonical JSON (sorted keys): equal text means equal software.
    fingerprint: Mapped[str] = mapped_column(String(1000))
    first_seen_at: Mapped[datetime]


class WorkerRow(Base):
    """A registered worker process."""

    __tablename__ = "workers"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    chip_id: Mapped[int] = mapped_column(ForeignKey("chips.id"))
    software_id: Mapped[int] = mapped_column(ForeignKey("software.id"))
    backends: Mapped[list[str]]
    kernels: Mapped[list[str]]
    #: Kernel name -> the version this worker runs (jobs of other versions pass it by).
    kernel_versions: Mapped[JsonDict | None]
    #: Kernel name -> the implementations this worker runs of it, in the kernel's order (what it
    #: leases: :mod:`tiletune.service.scheduling.backends`); NULL from a worker that does not report them.
    kernel_backends: Mapped[JsonDict | None]
    #: The token (``tokens.id``) the worker registered with: only it may lease and write as this
    #: worker. No foreign key (tokens are revoked, never deleted; SQLite adds no key in place).
    token_id: Mapped[int | None]
    registered_at: Mapped[datetime]
    last_seen_at: Mapped[datetime]


class SweepRow(Base):
    """A submitted sweep: the request as sent, for reference; its jobs carry the work."""

    __tablename__ = "sweeps"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str | None] = mapped_column(String(200))
    kernels: Mapped[list[str]]
    request: Mapped[JsonDict]
    #: The token (``tokens.id``) that submitted it: a submitter may cancel only its own sweeps.
    owner_token_id: Mapped[int | None]
    #: The ``Idempotency-Key`` it was submitted with, scoped by its token (``<token id>:<key>``;
    #: ``-:<key>`` without one); unique where set: the same scoped key answers this sweep again.
    idempotency_key: Mapped[str | None] = mapped_column(String(300), index=True, unique=True)
    #: SHA-256 of its request (canonical JSON) where it has an idempotency key: another request
    #: under the same key is refused.
    request_digest: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime]


class JobRow(Base):
    """The tuning of one (kernel, shape, dtype, chip target).

    ``chip_target`` is a chip name or ``*`` (any); ``chip_id`` is set when the
    job binds to a chip (at its first lease). ``backend`` is the implementation it runs: the
    sweep's, or NULL until its first lease chooses one for the leasing worker (kept after).
    ``active_leases`` counts leases not yet ended: leasing is a compare-and-set on it.
    ``state``: queued, running, validating, done, failed, cancelled, skipped.
    """

    __tablename__ = "jobs"
    __table_args__ = (
        Index(None, "state", "chip_target"),
        # One live job per key, enforced by the database whatever the concurrency.
        Index(
            LIVE_KEY_INDEX,
            "kernel",
            "kernel_version",
            "shape_key",
            "dtype",
            "chip_target",
            unique=True,
            sqlite_where=text(LIVE_STATE_SQL),
            postgresql_where=text(LIVE_STATE_SQL),
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    sweep_id: Mapped[int] = mapped_column(ForeignKey("sweeps.id"), index=True)
    kernel: Mapped[str] = mapped_column(String(64))
    kernel_version: Mapped[int]
    shape: Mapped[JsonDict]
    shape_key: Mapped[str] = mapped_column(String(500))
    dtype: Mapped[str] = mapped_column(String(16))
    chip_target: Mapped[str] = mapped_column(String(200))
    chip_id: Mapped[int | None] = mapped_column(ForeignKey("chips.id"))
    backend: Mapped[str | None] = mapped_column(String(32))
    strategy: Mapped[str] = mapped_column(String(16))
    trials: Mapped[int]
    max_time_s: Mapped[float | None] = mapped_column(Float)
    patience: Mapped[int | None]
    seed: Mapped[int]
    workers_per_job: Mapped[int]
    validate_top: Mapped[int]
    force: Mapped[bool] = mapped_column(Boolean)
    state: Mapped[str] = mapped_column(String(16))
    active_leases: Mapped[int] = mapped_column(Integer, default=0)
    validator_lease_id: Mapped[int | None] = mapped_column(Integer)
    lease_failures: Mapped[int] = mapped_column(Integer, default=0)
    #: Moves with every change of the job's search trials (ask, tell, abandon): a replica's
    #: in-memory search of the job is current exactly when it was built at this number.
    search_seq: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    failure_reasons: Mapped[list[str]]
    #: A job born ``skipped`` because a live job of its key tunes it: that job's id.
    tuned_by_job_id: Mapped[int | None] = mapped_column(Integer)
    #: The worker whose search trial leads: it may not validate while another of the chip is online.
    validation_excluded_worker_id: Mapped[int | None] = mapped_column(Integer)
    #: Who measured the winner, who confirmed it, and whether they agree (``service.confirmation``).
    confirmation: Mapped[JsonDict | None]
    default_config: Mapped[JsonDict | None]
    completed: Mapped[int] = mapped_column(Integer, default=0)
    invalid: Mapped[int] = mapped_column(Integer, default=0)
    failed: Mapped[int] = mapped_column(Integer, default=0)
    best_ms: Mapped[float | None] = mapped_column(Float)
    best_config: Mapped[JsonDict | None]
    default_ms: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]


class LeaseRow(Base):
    """A worker's claim on a job until ``expires_at``; ``ended_at`` set when released or expired."""

    __tablename__ = "leases"

    id: Mapped[int] = mapped_column(primary_key=True)
    token: Mapped[str] = mapped_column(String(64), unique=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"), index=True)
    worker_id: Mapped[int] = mapped_column(ForeignKey("workers.id"))
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime]
    ended_at: Mapped[datetime | None] = mapped_column(index=True)
    end_reason: Mapped[str | None] = mapped_column(Text)


class TrialRow(Base):
    """One config asked for a job, and its outcome.

    ``number`` is the Optuna trial number (the ``trial_id`` of the worker
    protocol) for search trials, ``None`` for validation runs. ``state``:
    asked, measured, failed, invalid, abandoned (its lease ended before a
    tell: the config is asked again under a new number), validated.
    """

    __tablename__ = "trials"
    __table_args__ = (UniqueConstraint("job_id", "number"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"), index=True)
    number: Mapped[int | None]
    lease_id: Mapped[int | None] = mapped_column(ForeignKey("leases.id"))
    phase: Mapped[str] = mapped_column(String(16))
    config: Mapped[JsonDict]
    state: Mapped[str] = mapped_column(String(16))
    median_ms: Mapped[float | None] = mapped_column(Float)
    p10_ms: Mapped[float | None] = mapped_column(Float)
    p90_ms: Mapped[float | None] = mapped_column(Float)
    min_ms: Mapped[float | None] = mapped_column(Float)
    samples: Mapped[int | None]
    pruned: Mapped[bool] = mapped_column(Boolean, default=False)
    reason: Mapped[str | None] = mapped_column(Text)
    asked_at: Mapped[datetime]
    told_at: Mapped[datetime | None]
    #: The machine's state while the trial was measured (``ConditionsWire``); NULL when its
    #: worker sent none (an older release) or it was not measured.
    conditions: Mapped[JsonDict | None]


class BestConfigRow(Base):
    """The promoted best config of one key, with its measurement and provenance."""

    __tablename__ = "best_configs"
    __table_args__ = (UniqueConstraint("kernel", "kernel_version", "shape_key", "dtype", "chip_id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    kernel: Mapped[str] = mapped_column(String(64))
    kernel_version: Mapped[int]
    shape_key: Mapped[str] = mapped_column(String(500))
    shape: Mapped[JsonDict]
    dtype: Mapped[str] = mapped_column(String(16))
    chip_id: Mapped[int] = mapped_column(ForeignKey("chips.id"), index=True)
    config: Mapped[JsonDict]
    median_ms: Mapped[float] = mapped_column(Float)
    default_config: Mapped[JsonDict | None]
    default_ms: Mapped[float | None] = mapped_column(Float)
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id"))
    trial_id: Mapped[int | None] = mapped_column(ForeignKey("trials.id"))
    software_id: Mapped[int | None] = mapped_column(ForeignKey("software.id"))
    promoted_at: Mapped[datetime]


class PromotionRow(Base):
    """One promotion of a key (the history of its best config)."""

    __tablename__ = "promotions"
    __table_args__ = (Index(None, "kernel", "shape_key", "dtype"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    kernel: Mapped[str] = mapped_column(String(64))
    kernel_version: Mapped[int]
    shape_key: Mapped[str] = mapped_column(String(500))
    dtype: Mapped[str] = mapped_column(String(16))
    chip_id: Mapped[int] = mapped_column(ForeignKey("chips.id"))
    config: Mapped[JsonDict]
    median_ms: Mapped[float] = mapped_column(Float)
    default_ms: Mapped[float | None] = mapped_column(Float)
    previous_ms: Mapped[float | None] = mapped_column(Float)
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id"))
    trial_id: Mapped[int | None] = mapped_column(ForeignKey("trials.id"))
    software_id: Mapped[int | None] = mapped_column(ForeignKey("software.id"))
    promoted_at: Mapped[datetime]


class MissRow(Base):
    """How often clients missed one key (no exact best config), and the demand job queued for it.

    The key names the chip by ``chip_name`` (what clients report): misses on a
    chip no worker has registered are counted too, with ``chip_id`` ``NULL``
    until a report arrives after the chip registered. ``last_match`` is the answer
    of the last report (``nearest`` or ``default``); ``job_id`` the job demand
    queued for the key (at most one).
    """

    __tablename__ = "misses"
    __table_args__ = (
        UniqueConstraint("kernel", "kernel_version", "shape_key", "dtype", "chip_name"),
        Index(None, "chip_id", "demand_queued_at"),  # the demand budget: a chip's keys queued lately
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    kernel: Mapped[str] = mapped_column(String(64))
    kernel_version: Mapped[int]
    shape: Mapped[JsonDict]
    shape_key: Mapped[str] = mapped_column(String(500))
    dtype: Mapped[str] = mapped_column(String(16))
    chip_name: Mapped[str] = mapped_column(String(200))
    chip_id: Mapped[int | None] = mapped_column(ForeignKey("chips.id"))
    count: Mapped[int] = mapped_column(Integer)
    last_match: Mapped[str] = mapped_column(String(16))
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id"))
    first_seen_at: Mapped[datetime]
    last_seen_at: Mapped[datetime]
    #: When demand queued a job for the key (the demand budget counts them per chip); ``None``: never.
    demand_queued_at: Mapped[datetime | None]
    #: The bytes a bench of the key holds (``KernelDeclaration.allocated_bytes``), set by each report: demand
    #: passes over keys above ``TILETUNE_MAX_SHAPE_BYTES``. ``None``: not reported since revision 0006.
    bench_bytes: Mapped[int | None] = mapped_column(BigInteger)


class KeyUsageRow(Base):
    """How often one key (kernel, version, canonical shape, dtype) was launched on a registered chip:
    the server's exact lookups of it and the per-key counts clients report with their stats
    (see :mod:`tiletune.service.demand.key_usage`). Re-tuning after a software change takes the most
    launched stale keys first."""

    __tablename__ = "key_usage"
    __table_args__ = (UniqueConstraint("chip_id", "kernel", "kernel_version", "shape_key", "dtype"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    chip_id: Mapped[int] = mapped_column(ForeignKey("chips.id"))
    kernel: Mapped[str] = mapped_column(String(64))
    kernel_version: Mapped[int]
    shape_key: Mapped[str] = mapped_column(String(500))
    dtype: Mapped[str] = mapped_column(String(16))
    launches: Mapped[int] = mapped_column(BigInteger)
    last_seen_at: Mapped[datetime]


class RetunePlanRow(Base):
    """One chip's re-tuning planned for one software change (at most one per chip and software):
    how many of its keys were stale then and how many jobs it queued
    (see :mod:`tiletune.service.demand.retune`)."""

    __tablename__ = "retune_plans"
    __table_args__ = (UniqueConstraint("chip_id", "software_id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    chip_id: Mapped[int] = mapped_column(ForeignKey("chips.id"))
    software_id: Mapped[int] = mapped_column(ForeignKey("software.id"))
    stale: Mapped[int] = mapped_column(Integer)
    queued: Mapped[int] = mapped_column(Integer)
    planned_at: Mapped[datetime]


class RetuneRow(Base):
    """A stale best config queued for re-tuning after its chip's software changed: the key, the job,
    the best it had then (``old_*``: served until the job's validation promotes a config that beat it
    in the same run) and the launches that ranked it."""

    __tablename__ = "retunes"
    __table_args__ = (
        UniqueConstraint("software_id", "kernel", "kernel_version", "shape_key", "dtype"),
        Index(None, "chip_id", "queued_at"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    chip_id: Mapped[int] = mapped_column(ForeignKey("chips.id"))
    #: The software whose registration made the key stale (the chip's newest then).
    software_id: Mapped[int] = mapped_column(ForeignKey("software.id"))
    kernel: Mapped[str] = mapped_column(String(64))
    kernel_version: Mapped[int]
    shape_key: Mapped[str] = mapped_column(String(500))
    dtype: Mapped[str] = mapped_column(String(16))
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"))
    old_config: Mapped[JsonDict]
    old_ms: Mapped[float] = mapped_column(Float)
    old_software_id: Mapped[int | None]
    launches: Mapped[int] = mapped_column(BigInteger)
    queued_at: Mapped[datetime]
