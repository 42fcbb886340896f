"""The cores a chip's workers report: ``chips.cores``.

Written by hand: one nullable column added in place (offline SQL works on SQLite too). The
chips already registered keep NULL (not known) until a worker that reports its cores
registers; their jobs are planned as before until then.

Downgrade drops the column in place.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02 03:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add chips.cores (NULL: not reported)."""
    op.add_column("chips", sa.Column("cores", sa.Integer(), nullable=True))


def downgrade() -> None:
    """Drop chips.cores, in place: a copy of the table (batch mode) could not replace chips while
    workers and best configs refer to it (SQLite drops a plain column in place since 3.35)."""
    op.drop_column("chips", "cores")
