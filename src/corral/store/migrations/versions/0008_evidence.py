"""config_revisions: the evidence a change was decided on (a what-if's summary, or a forced reason)

Revision ID: 0008_evidence
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008_evidence"
down_revision = "0007_notify"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("config_revisions") as batch:
        batch.add_column(sa.Column("evidence", sa.Text(), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("config_revisions") as batch:
        batch.drop_column("evidence")
