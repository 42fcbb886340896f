"""Workers record the version of each kernel they run, so jobs of another version pass them by.

Written by hand (one nullable column: no batch mode needed on SQLite); downgrade drops it.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29 14:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add workers.kernel_versions (kernel name -> version; NULL for workers registered before)."""
    op.add_column("workers", sa.Column("kernel_versions", sa.JSON(), nullable=True))


def downgrade() -> None:
    """Drop workers.kernel_versions."""
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("kernel_versions")
