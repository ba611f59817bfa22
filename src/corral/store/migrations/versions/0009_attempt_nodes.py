"""attempt_nodes: one row per node of an attempt (0-GPU attempts included), filled from the
placement JSON of the attempts already in the database

Revision ID: 0009_attempt_nodes
Revises: 0008_evidence
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = "0009_attempt_nodes"
down_revision = "0008_evidence"
branch_labels = None
depends_on = None

BATCH = 1000


def upgrade() -> None:
    table = op.create_table(
        "attempt_nodes",
        sa.Column("job_id", sa.String(64), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("node", sa.String(200), nullable=False),
        sa.Column("master", sa.Boolean(), nullable=False, server_default=sa.text("false")),
        sa.PrimaryKeyConstraint("job_id", "attempt", "node"),
    )
    op.create_index("ix_attempt_nodes_node", "attempt_nodes", ["node"])
    _fill(op.get_bind(), table)


def _fill(conn: sa.Connection, table: sa.Table) -> None:
    """Every existing attempt's nodes, read from its placement (ended ones too: a late report of
    an ended attempt is answered 409, not 404), in batches in key order."""
    a = sa.table("attempts", sa.column("job_id"), sa.column("attempt"), sa.column("placement"))
    last: tuple[str, int] | None = None
    while True:
        q = sa.select(a.c.job_id, a.c.attempt, a.c.placement).order_by(a.c.job_id, a.c.attempt).limit(BATCH)
        if last is not None:
            q = q.where(sa.or_(a.c.job_id > last[0], sa.and_(a.c.job_id == last[0], a.c.attempt > last[1])))
        rows = conn.execute(q).all()
        if not rows:
            return
        values = []
        for r in rows:
            placement = json.loads(r.placement or "[]")
            master = str(placement[0]["node"]) if placement else None
            for node in dict.fromkeys(str(p["node"]) for p in placement):
                values.append(
                    {"job_id": r.job_id, "attempt": r.attempt, "node": node, "master": node == master}
                )
        if values:
            conn.execute(sa.insert(table), values)
        last = (rows[-1].job_id, rows[-1].attempt)


def downgrade() -> None:
    op.drop_index("ix_attempt_nodes_node", table_name="attempt_nodes")
    op.drop_table("attempt_nodes")
