"""The conditions a trial was measured in: ``trials.conditions``.

Written by hand: one nullable JSON column added in place (offline SQL works on SQLite too). The
trials already stored keep NULL (their workers sent no conditions), as do those of workers of an
earlier release, which send none.

Downgrade drops the column in place: a copy of the table (batch mode) could not replace trials
while best configs refer to it (SQLite drops a plain column in place since 3.35).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04 00:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add trials.conditions (NULL: not sent)."""
    op.add_column("trials", sa.Column("conditions", sa.JSON(), nullable=True))


def downgrade() -> None:
    """Drop trials.conditions, in place."""
    op.drop_column("trials", "conditions")
