"""What the scheduler reads back after a start: live attempts put back on their GPUs, and exit
reports a crash left behind the journal cursor."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import select

from corral.core.jobs import PendingJob
from corral.core.model import JobId, NodeName
from corral.core.state import ClusterState
from corral.server.jobs import spec_from_json
from corral.store import schema


def unapplied_exits(conn: Any) -> list[Any]:
    """Exit reports in the journal for attempts not yet ended: a crash between an agent's
    report and the attempt's ending leaves them behind the cursor, so they are replayed."""
    e, a = schema.events, schema.attempts
    return list(
        conn.execute(
            select(e.c.seq, e.c.kind, e.c.job, e.c.body)
            .join(a, (a.c.job_id == e.c.job) & (a.c.state != "ended"))
            .where(e.c.kind == "x.exit")
            .order_by(e.c.seq)
        ).all()
    )


def restore_attempt(state: ClusterState, row: Any) -> None:
    spec = spec_from_json(row.spec)
    job = PendingJob(spec, attempts=row.attempt - 1)  # straight to running: never queued
    placement = []
    for replica in json.loads(row.placement):
        mask = 0
        for g in replica["gpus"]:
            mask |= 1 << g
        placement.append((state.node_ids[NodeName(replica["node"])], mask))
    state.start(job, placement, row.started_at)
    if row.last_checkpoint is not None:
        state.record_checkpoint(spec.id, row.last_checkpoint)
    if row.state == "stopping":
        state.mark_preempting(
            spec.id, row.deadline or row.started_at, JobId(row.stop_by) if row.stop_by else None
        )
