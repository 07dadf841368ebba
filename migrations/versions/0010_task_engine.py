"""task engine: the serving engine a launcher registered with a replica's task, for the node's agent to scrape

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04 23:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(sa.Column("engine", sa.String(300), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("engine")
