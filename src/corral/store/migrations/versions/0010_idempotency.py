"""idempotency_keys: a client's Idempotency-Key on a submission, mapped to the job it made

Revision ID: 0010_idempotency
Revises: 0009_attempt_nodes
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010_idempotency"
down_revision = "0009_attempt_nodes"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "idempotency_keys",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("user", sa.String(length=200), nullable=False),
        sa.Column("key", sa.String(length=255), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
    )
    op.create_index("ux_idempotency_user_key", "idempotency_keys", ["user", "key"], unique=True)
    op.create_index("ix_idempotency_created", "idempotency_keys", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_idempotency_created", table_name="idempotency_keys")
    op.drop_index("ux_idempotency_user_key", table_name="idempotency_keys")
    op.drop_table("idempotency_keys")
