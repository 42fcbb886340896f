"""Re-tuning after software changes: ``key_usage`` (launches per key and chip), ``retune_plans``
(one per chip and software change) and ``retunes`` (the stale keys queued, with their old best).

Written by hand: three new tables, their foreign keys created with them (SQLite needs no batch
mode); downgrade drops them (what re-tuning queued stays as ordinary jobs).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04 01:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_KEY = ("kernel", "kernel_version", "shape_key", "dtype")


def _key_columns() -> list[sa.Column[object]]:
    return [
        sa.Column("kernel", sa.String(length=64), nullable=False),
        sa.Column("kernel_version", sa.Integer(), nullable=False),
        sa.Column("shape_key", sa.String(length=500), nullable=False),
        sa.Column("dtype", sa.String(length=16), nullable=False),
    ]


def upgrade() -> None:
    """Create key_usage, retune_plans and retunes."""
    op.create_table(
        "key_usage",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("chip_id", sa.Integer(), nullable=False),
        *_key_columns(),
        sa.Column("launches", sa.BigInteger(), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["chip_id"], ["chips.id"], name=op.f("fk_key_usage_chip_id_chips")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_key_usage")),
        sa.UniqueConstraint(
            "chip_id", *_KEY, name=op.f("uq_key_usage_chip_id_kernel_kernel_version_shape_key_dtype")
        ),
    )
    op.create_table(
        "retune_plans",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("chip_id", sa.Integer(), nullable=False),
        sa.Column("software_id", sa.Integer(), nullable=False),
        sa.Column("stale", sa.Integer(), nullable=False),
        sa.Column("queued", sa.Integer(), nullable=False),
        sa.Column("planned_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["chip_id"], ["chips.id"], name=op.f("fk_retune_plans_chip_id_chips")),
        sa.ForeignKeyConstraint(
            ["software_id"], ["software.id"], name=op.f("fk_retune_plans_software_id_software")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_retune_plans")),
        sa.UniqueConstraint("chip_id", "software_id", name=op.f("uq_retune_plans_chip_id_software_id")),
    )
    op.create_table(
        "retunes",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("chip_id", sa.Integer(), nullable=False),
        sa.Column("software_id", sa.Integer(), nullable=False),
        *_key_columns(),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("old_config", sa.JSON(), nullable=False),
        sa.Column("old_ms", sa.Float(), nullable=False),
        sa.Column("old_software_id", sa.Integer(), nullable=True),
        sa.Column("launches", sa.BigInteger(), nullable=False),
        sa.Column("queued_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["chip_id"], ["chips.id"], name=op.f("fk_retunes_chip_id_chips")),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_retunes_job_id_jobs")),
        sa.ForeignKeyConstraint(
            ["software_id"], ["software.id"], name=op.f("fk_retunes_software_id_software")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_retunes")),
        sa.UniqueConstraint(
            "software_id", *_KEY, name=op.f("uq_retunes_software_id_kernel_kernel_version_shape_key_dtype")
        ),
    )
    op.create_index(op.f("ix_retunes_chip_id_queued_at"), "retunes", ["chip_id", "queued_at"], unique=False)


def downgrade() -> None:
    """Drop retunes, retune_plans and key_usage."""
    op.drop_index(op.f("ix_retunes_chip_id_queued_at"), table_name="retunes")
    op.drop_table("retunes")
    op.drop_table("retune_plans")
    op.drop_table("key_usage")
