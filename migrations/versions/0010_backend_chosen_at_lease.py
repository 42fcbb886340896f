"""A job's backend is chosen at its first lease: ``jobs.backend`` nullable, ``workers.kernel_backends``.

Written by hand, every change in place (offline SQL works on SQLite too):

- ``workers.kernel_backends`` (kernel -> the implementations the worker runs of it): one nullable
  column; workers registered before keep NULL (not reported);
- ``jobs.backend`` becomes nullable (NULL: not chosen yet). PostgreSQL drops the NOT NULL. SQLite
  cannot alter a column, and a copy of the table (batch mode) could not replace ``jobs`` while
  leases, trials and best configs refer to it: the values move to a new nullable column, the old
  one is dropped and the new one takes its name (the column moves to the end of the table);
- the jobs still ``queued`` that never had a lease, of sweeps whose request named no backend, get
  NULL: their first lease chooses the backend the leasing worker's chip runs best. Every other
  job keeps the backend it was created with (one that ran has trials of it).

Downgrade gives each job with no backend the one the previous release created such jobs with
(``native`` for ``native_*`` kernels, ``triton`` for ``triton_*``, else ``torch``: a plugin or
replay kernel whose only implementation is another is left to a person), makes the column NOT
NULL again on PostgreSQL (on SQLite it stays nullable: the previous release always writes one)
and drops ``workers.kernel_backends``.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03 01:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: The SQL of "the sweep's request names no backend", per dialect.
_NAMES_NO_BACKEND = {
    "sqlite": "json_extract(sweeps.request, '$.backend') IS NULL",
    "postgresql": "(sweeps.request ->> 'backend') IS NULL",
}

#: The backend the previous release gave a job of a sweep that named none, by kernel name.
_PREVIOUS_DEFAULT = (
    "CASE WHEN kernel LIKE 'native!_%' ESCAPE '!' THEN 'native'"
    " WHEN kernel LIKE 'triton!_%' ESCAPE '!' THEN 'triton' ELSE 'torch' END"
)


def _sqlite() -> bool:
    return op.get_context().dialect.name == "sqlite"


def upgrade() -> None:
    """Add workers.kernel_backends; make jobs.backend nullable; unchoose it for jobs never leased."""
    op.add_column("workers", sa.Column("kernel_backends", sa.JSON(), nullable=True))
    if _sqlite():
        op.add_column("jobs", sa.Column("backend_chosen", sa.String(length=32), nullable=True))
        op.execute("UPDATE jobs SET backend_chosen = backend")
        op.execute("ALTER TABLE jobs DROP COLUMN backend")
        op.execute("ALTER TABLE jobs RENAME COLUMN backend_chosen TO backend")
    else:
        op.alter_column("jobs", "backend", existing_type=sa.String(length=32), nullable=True)
    names_none = _NAMES_NO_BACKEND[op.get_context().dialect.name]
    op.execute(
        "UPDATE jobs SET backend = NULL WHERE state = 'queued'"
        " AND NOT EXISTS (SELECT 1 FROM leases WHERE leases.job_id = jobs.id)"
        f" AND EXISTS (SELECT 1 FROM sweeps WHERE sweeps.id = jobs.sweep_id AND {names_none})"
    )


def downgrade() -> None:
    """Give jobs without a backend the previous release's default; drop workers.kernel_backends."""
    op.execute(f"UPDATE jobs SET backend = {_PREVIOUS_DEFAULT} WHERE backend IS NULL")
    if not _sqlite():
        op.alter_column("jobs", "backend", existing_type=sa.String(length=32), nullable=False)
    op.drop_column("workers", "kernel_backends")
