"""Which jobs run where: the allocations table, one row per GPU of a live attempt, is the one
answer to "what runs on node N" (never the placement JSON of the attempts)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, select

from corral.store import schema


def gpu_owners(conn: Connection) -> dict[tuple[str, int], Any]:
    """(node, GPU) -> the live allocation's job, attempt, queue, team and user."""
    al, j = schema.allocations, schema.jobs
    rows = conn.execute(
        select(al.c.node, al.c.gpu, al.c.job_id, al.c.attempt, j.c.queue, j.c.team, j.c.user)
        .join(j, j.c.id == al.c.job_id)
        .where(al.c.live == 1)
    ).all()
    return {(r.node, r.gpu): r for r in rows}
