"""One live job per key, and idempotent sweeps: ``uq_jobs_live_key``, ``jobs.tuned_by_job_id``,
``sweeps.idempotency_key`` and ``sweeps.request_digest``.

Written by hand, every change in place (no table copy: leases, trials and best configs refer to
``jobs``):

- a key (kernel, version, shape, dtype, chip target) with more than one live job (queued,
  running, validating: what the previous release let concurrent or repeated sweeps make) keeps
  its oldest; each other is cancelled, with the reason and the job that tunes the key
  (``tuned_by_job_id``), before the partial unique index is built;
- ``sweeps`` gains its idempotency key (scoped by token, unique where set) and request digest,
  NULL for every earlier sweep.

Downgrade drops them; the jobs it cancelled stay cancelled.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-07 09:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_LIVE = "state IN ('queued', 'running', 'validating')"
_KEY = ("kernel", "kernel_version", "shape_key", "dtype", "chip_target")
_SAME_KEY = " AND ".join(f"oldest.{column} = jobs.{column}" for column in _KEY)
#: The oldest live job of the key of the ``jobs`` row at hand, other than itself.
_OLDEST_OTHER = (
    f"SELECT MIN(oldest.id) FROM jobs AS oldest WHERE {_SAME_KEY} AND oldest.{_LIVE} AND oldest.id < jobs.id"
)
_REASON = "cancelled by the upgrade to one live job per key: an older live job tunes this key"


def upgrade() -> None:
    """Cancel all but the oldest live job of each key; add the index and the new columns."""
    op.add_column("jobs", sa.Column("tuned_by_job_id", sa.Integer(), nullable=True))
    dialect = op.get_context().dialect.name
    reasons = (
        f"json_insert(failure_reasons, '$[#]', '{_REASON}')"
        if dialect == "sqlite"
        else f"(failure_reasons::jsonb || to_jsonb('{_REASON}'::text))::json"
    )
    op.execute(
        f"UPDATE jobs SET state = 'cancelled', tuned_by_job_id = ({_OLDEST_OTHER}),"
        f" failure_reasons = {reasons}, finished_at = updated_at"
        f" WHERE {_LIVE} AND ({_OLDEST_OTHER}) IS NOT NULL"
    )
    op.create_index(
        "uq_jobs_live_key",
        "jobs",
        list(_KEY),
        unique=True,
        sqlite_where=sa.text(_LIVE),
        postgresql_where=sa.text(_LIVE),
    )
    op.add_column("sweeps", sa.Column("idempotency_key", sa.String(length=300), nullable=True))
    op.add_column("sweeps", sa.Column("request_digest", sa.String(length=64), nullable=True))
    op.create_index(op.f("ix_sweeps_idempotency_key"), "sweeps", ["idempotency_key"], unique=True)


def downgrade() -> None:
    """Drop the sweeps' idempotency columns, the index and ``jobs.tuned_by_job_id``."""
    op.drop_index(op.f("ix_sweeps_idempotency_key"), table_name="sweeps")
    op.drop_column("sweeps", "request_digest")
    op.drop_column("sweeps", "idempotency_key")
    op.drop_index("uq_jobs_live_key", table_name="jobs")
    op.drop_column("jobs", "tuned_by_job_id")
