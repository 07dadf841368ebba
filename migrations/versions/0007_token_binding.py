"""token node binding and per-token rate limit

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30 19:50:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.add_column(sa.Column("node", sa.String(length=256), nullable=True))
        batch_op.add_column(sa.Column("rate_limit_per_second", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.drop_column("rate_limit_per_second")
        batch_op.drop_column("node")
