"""nodes: where the agent serves logs, and the token it registered with

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("logs_url", sa.String(length=300), server_default="", nullable=False))
        batch.add_column(sa.Column("agent_token", sa.String(length=32), server_default="", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("agent_token")
        batch.drop_column("logs_url")
