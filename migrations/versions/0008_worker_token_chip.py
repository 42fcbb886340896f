"""Worker tokens bound to a chip: ``tokens.chip_name``.

Written by hand: one nullable column added in place (offline SQL works on SQLite too), then
the worker tokens already in use are bound as they were used, so no running worker is refused:

- a worker token whose workers registered one chip is bound to it;
- one whose workers registered several chips is bound to ``*`` (every chip, as before; an
  admin replaces it with a token per chip);
- one with no workers yet stays unbound (NULL): its first registration binds it.

Downgrade drops the column (batch mode).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02 02:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: How many chips a token's workers registered.
_CHIPS_OF_TOKEN = "(SELECT COUNT(DISTINCT workers.chip_id) FROM workers WHERE workers.token_id = tokens.id)"


def upgrade() -> None:
    """Add tokens.chip_name; bind the worker tokens in use to the chips of their workers."""
    op.add_column("tokens", sa.Column("chip_name", sa.String(length=200), nullable=True))
    op.execute(
        "UPDATE tokens SET chip_name = (SELECT MIN(chips.name) FROM workers JOIN chips"
        " ON chips.id = workers.chip_id WHERE workers.token_id = tokens.id)"
        f" WHERE role = 'worker' AND {_CHIPS_OF_TOKEN} = 1"
    )
    op.execute(f"UPDATE tokens SET chip_name = '*' WHERE role = 'worker' AND {_CHIPS_OF_TOKEN} > 1")


def downgrade() -> None:
    """Drop tokens.chip_name."""
    with op.batch_alter_table("tokens") as batch:
        batch.drop_column("chip_name")
