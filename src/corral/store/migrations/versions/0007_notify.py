"""webhook notifications: the deliveries (persisted, so none is lost or sent twice across a
restart), the journal cursor of the notifier, and indexes for `corral acct`

Revision ID: 0007_notify
Revises: 0005
"""

from __future__ import annotations

import secrets

import sqlalchemy as sa
from alembic import op

revision = "0007_notify"
down_revision = "0006_arrays_deps"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "notify_deliveries",
        sa.Column("id", sa.String(length=120), primary_key=True),
        sa.Column("sink", sa.String(length=64), nullable=False),
        sa.Column("event_seq", sa.Integer(), nullable=False),
        sa.Column("job", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("next_at", sa.Float(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("delivered_at", sa.Float(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=False, server_default=""),
    )
    op.create_index("ix_notify_deliveries_state_next", "notify_deliveries", ["state", "next_at"])
    op.create_index("ix_notify_deliveries_job", "notify_deliveries", ["job"])
    # the notifier starts after the journal as it is now: no notification for what came before
    op.execute(
        "INSERT INTO settings (key, value) "
        "SELECT 'notify.cursor', CAST(COALESCE(MAX(seq), 0) AS VARCHAR(20)) FROM events"
    )
    # part of every delivery id: a database made anew never reuses the ids of another
    op.get_bind().execute(
        sa.text("INSERT INTO settings (key, value) VALUES ('notify.instance', :value)"),
        {"value": secrets.token_hex(4)},
    )
    # `corral acct`: a member's rows (team), a user's, and the time window
    op.create_index("ix_jobs_team_seq", "jobs", ["team", "seq"])
    op.create_index("ix_jobs_user_seq", "jobs", ["user", "seq"])
    op.create_index("ix_jobs_end_time", "jobs", ["end_time"])


def downgrade() -> None:
    op.drop_index("ix_jobs_end_time", table_name="jobs")
    op.drop_index("ix_jobs_user_seq", table_name="jobs")
    op.drop_index("ix_jobs_team_seq", table_name="jobs")
    op.execute("DELETE FROM settings WHERE key IN ('notify.cursor', 'notify.instance')")
    op.drop_index("ix_notify_deliveries_job", table_name="notify_deliveries")
    op.drop_index("ix_notify_deliveries_state_next", table_name="notify_deliveries")
    op.drop_table("notify_deliveries")
