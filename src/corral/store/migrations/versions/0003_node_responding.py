"""nodes: whether a registered node answers (no new work while it is silent)

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(
            sa.Column("responding", sa.Boolean(), server_default=sa.text("true"), nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("responding")
