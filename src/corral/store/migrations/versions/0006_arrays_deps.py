"""jobs: job arrays (`array_id`, `array_task`, table `arrays` with the `%N` cap) and dependencies

Revision ID: 0006_arrays_deps
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_arrays_deps"
down_revision = "0005"  # main's 0005_reason_at.py declares revision "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("array_id", sa.String(64), nullable=True))
        batch.add_column(sa.Column("array_task", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("dependency", sa.Text(), nullable=False, server_default=""))
        batch.create_index("ix_jobs_array", ["array_id"])
    op.create_table(
        "arrays",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("spec", sa.Text(), nullable=False),
        sa.Column("tasks", sa.Integer(), nullable=False),
        sa.Column("max_running", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("team", sa.String(200), nullable=False, server_default=""),
        sa.Column("created_at", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("arrays")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_array")
        batch.drop_column("dependency")
        batch.drop_column("array_task")
        batch.drop_column("array_id")
