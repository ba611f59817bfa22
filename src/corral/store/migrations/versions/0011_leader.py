"""leader (the scheduler's lease and fencing epoch), node_heard (liveness shared by replicas),
login_codes (dashboard login codes any replica may redeem)

Revision ID: 0011_leader
Revises: 0010_idempotency
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011_leader"
down_revision = "0010_idempotency"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "leader",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("holder", sa.String(200), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.Column("since", sa.Float(), nullable=False),
    )
    op.create_table(
        "node_heard",
        sa.Column("node", sa.String(200), primary_key=True),
        sa.Column("heard_at", sa.Float(), nullable=False),
    )
    op.create_table(
        "login_codes",
        sa.Column("hash", sa.String(64), primary_key=True),
        sa.Column("sealed", sa.Text(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("login_codes")
    op.drop_table("node_heard")
    op.drop_table("leader")
