"""Browser sessions: a signed-in browser holds a random session id; only its digest is stored.

Written by hand: one new table (its foreign key is created with it, so SQLite needs no batch
mode); downgrade drops it, which signs every browser out. Browsers whose cookie held a token
(before this revision) sign in again.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02 02:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create browser_sessions."""
    op.create_table(
        "browser_sessions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("token_id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["token_id"], ["tokens.id"], name=op.f("fk_browser_sessions_token_id_tokens")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_browser_sessions")),
        sa.UniqueConstraint("digest", name=op.f("uq_browser_sessions_digest")),
    )
    op.create_index(op.f("ix_browser_sessions_token_id"), "browser_sessions", ["token_id"], unique=False)


def downgrade() -> None:
    """Drop browser_sessions (every browser signs in again)."""
    op.drop_index(op.f("ix_browser_sessions_token_id"), table_name="browser_sessions")
    op.drop_table("browser_sessions")
