"""The trials table is the record of every job's search: jobs.search_seq versions it.

Written by hand: one column added in place (``NOT NULL DEFAULT 0``, so existing rows get 0
and offline SQL works on SQLite too); downgrade drops it (batch mode). Optuna's own storage
(the ``X.optuna.log`` journal beside a SQLite file, the ``optuna`` schema on PostgreSQL) is
no longer read: a job's search is rebuilt from its trials; this revision leaves those files
and tables as they are.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 12:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add jobs.search_seq."""
    op.add_column("jobs", sa.Column("search_seq", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    """Drop jobs.search_seq."""
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("search_seq")
