"""A job's pick confirmed by another worker: ``jobs.validation_excluded_worker_id`` and
``jobs.confirmation``.

- ``validation_excluded_worker_id``: the worker whose search trial leads, which may not run the
  job's validation while another worker of its chip is online;
- ``confirmation``: who measured the winner and who confirmed it, both times and whether they
  agree (JSON; see ``tiletune.service.scheduling.confirmation``).

NULL for every earlier job. Downgrade drops both.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-07 12:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add the two columns."""
    op.add_column("jobs", sa.Column("validation_excluded_worker_id", sa.Integer(), nullable=True))
    op.add_column("jobs", sa.Column("confirmation", sa.JSON(), nullable=True))


def downgrade() -> None:
    """Drop them."""
    op.drop_column("jobs", "confirmation")
    op.drop_column("jobs", "validation_excluded_worker_id")
