"""policy decisions: the active placement / checkpoint-interval policy's choice beside its shadow's

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02 09:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import sentinel.db

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table("policy_decisions",
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
    sa.Column("at", sentinel.db.UTCDateTime(timezone=True), nullable=False),
    sa.Column("kind", sa.String(length=32), nullable=False),
    sa.Column("job_id", sa.Integer(), nullable=False),
    sa.Column("incident_id", sa.Integer(), nullable=True),
    sa.Column("active_policy", sa.String(length=64), nullable=False),
    sa.Column("active_choice", sa.JSON(), nullable=False),
    sa.Column("shadow_policy", sa.String(length=64), nullable=False),
    sa.Column("shadow_choice", sa.JSON(), nullable=True),
    sa.Column("agree", sa.Boolean(), nullable=True),
    sa.Column("explanation", sa.JSON(), nullable=False),
    sa.PrimaryKeyConstraint("id", name=op.f("pk_policy_decisions"))
    )
    with op.batch_alter_table("policy_decisions", schema=None) as batch_op:
        batch_op.create_index("ix_policy_decisions_kind_at", ["kind", "at"], unique=False)
        batch_op.create_index(batch_op.f("ix_policy_decisions_incident_id"), ["incident_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_policy_decisions_job_id"), ["job_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("policy_decisions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_policy_decisions_job_id"))
        batch_op.drop_index(batch_op.f("ix_policy_decisions_incident_id"))
        batch_op.drop_index("ix_policy_decisions_kind_at")

    op.drop_table("policy_decisions")
