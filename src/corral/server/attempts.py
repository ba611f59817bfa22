"""Stopping an attempt: the attempt row, the job row, a stop order to each of its nodes, and the
journal entry, in one place."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, update

from corral.server.context import Context
from corral.store import schema
from corral.store.engine import dumps


def requeue_attempt(
    ctx: Context,
    conn: Connection,
    job: str,
    attempt: int,
    placement: list[dict[str, Any]],
    grace: float,
    signal_in: float,
    by: str,
    why: str,
) -> bool:
    """Stop a live attempt by the checkpoint contract (the signal in `signal_in` s, the grace, a
    kill) and put its job back in its queue: a disruption, not a failure. False if it was not live."""
    a, j = schema.attempts, schema.jobs
    stop_at = ctx.clock() + signal_in
    changed = conn.execute(
        update(a)
        .where(a.c.job_id == job, a.c.attempt == attempt, a.c.state.in_(("starting", "running")))
        .values(state="stopping", stop_kind="requeue", stop_by=by, deadline=stop_at + grace)
    ).rowcount
    if changed != 1:
        return False
    conn.execute(
        update(j)
        .where(j.c.id == job, j.c.attempt == attempt)
        .values(state="stopping", version=j.c.version + 1)
    )
    order = {
        "kind": "stop",
        "job": job,
        "attempt": attempt,
        "grace": grace,
        "signal_in": signal_in,
        "why": why,
    }
    for target in sorted({p["node"] for p in placement}):
        conn.execute(schema.outbox.insert().values(node=target, body=dumps(order)))
    ctx.journal(conn, [{"event": "x.stop", "job": job, "attempt": attempt, "deadline": stop_at + grace}])
    return True
