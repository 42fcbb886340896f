"""Tokens: bearer tokens with roles (digests only); workers and sweeps record the token behind them.

Written by hand: two nullable columns added in place (no foreign keys, so no batch mode and
offline SQL works on SQLite too); downgrade drops them (batch mode) and the table. Rows made
before this revision have no token (NULL).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 09:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create tokens; add workers.token_id and sweeps.owner_token_id."""
    op.create_table(
        "tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tokens")),
        sa.UniqueConstraint("digest", name=op.f("uq_tokens_digest")),
    )
    op.add_column("workers", sa.Column("token_id", sa.Integer(), nullable=True))
    op.add_column("sweeps", sa.Column("owner_token_id", sa.Integer(), nullable=True))


def downgrade() -> None:
    """Drop the two columns and tokens."""
    with op.batch_alter_table("sweeps") as batch:
        batch.drop_column("owner_token_id")
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("token_id")
    op.drop_table("tokens")
