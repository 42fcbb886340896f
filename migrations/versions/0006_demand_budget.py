"""The demand budget: ``misses.demand_queued_at`` (when demand queued a key, indexed per chip) and
``misses.bench_bytes`` (the bytes a bench of the key holds, so demand passes over keys above the limit).

Written by hand: two nullable columns added in place and one index (offline SQL works on SQLite
too); downgrade drops them (batch mode). Keys counted before this revision have both ``NULL``:
their demand jobs (if any) no longer count against the budget, and their next report sets
``bench_bytes``.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02 02:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "ix_misses_chip_id_demand_queued_at"


def upgrade() -> None:
    """Add misses.demand_queued_at, misses.bench_bytes and the index of a chip's demand."""
    op.add_column("misses", sa.Column("demand_queued_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("misses", sa.Column("bench_bytes", sa.BigInteger(), nullable=True))
    op.create_index(INDEX, "misses", ["chip_id", "demand_queued_at"])


def downgrade() -> None:
    """Drop the index and the two columns."""
    op.drop_index(INDEX, table_name="misses")
    with op.batch_alter_table("misses") as batch:
        batch.drop_column("bench_bytes")
        batch.drop_column("demand_queued_at")
