"""jobs and reasons: the time a reason names (`reason_at`, `at`), so that clients can say how far away it is

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("reason_at", sa.Float(), nullable=True))
    with op.batch_alter_table("reasons") as batch:
        batch.add_column(sa.Column("at", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("reasons") as batch:
        batch.drop_column("at")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("reason_at")
