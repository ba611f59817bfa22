"""What node agents send and fetch besides registration: their incarnation checked, the orders
after a cursor (`GET /v1/agents/{node}/assignments`), and their reports applied
(`POST /v1/agents/{node}/reports`; docs/node-protocol.md 4, 5)."""

from __future__ import annotations

import json
import time
from typing import Any

from sqlalchemy import Connection, select, update

from corral.protocol import Report, ReportStatus, StopWhy, stop_order
from corral.server.allocations import placed_on
from corral.server.context import Context
from corral.server.errors import ApiError
from corral.store import schema


def check_incarnation(ctx: Context, node: str, incarnation: int) -> None:
    known = ctx.node_status.incarnations.get(node)
    if known is None:
        with ctx.engines.reader.connect() as conn:
            known = conn.execute(
                select(schema.nodes.c.incarnation).where(schema.nodes.c.name == node)
            ).scalar()
        if known is None:
            raise ApiError(404, f"no node {node}", fix="register first")
        ctx.node_status.incarnations[node] = known
    if incarnation != known:
        raise ApiError(
            409,
            f"stale incarnation {incarnation} of node {node} (current: {known})",
            fix="the agent must register again",
        )


def orders_after(ctx: Context, node: str, after: int) -> list[dict[str, Any]]:
    """The node's orders after `after`. The start of an attempt that has already ended (a node cut
    off before it fetched the order, lost meanwhile, fetches it when it comes back) is sent as a
    stop: an ended attempt never starts (DESIGN.md 6.1), and the agent's cursor still moves on."""
    o, a = schema.outbox, schema.attempts
    with ctx.engines.reader.connect() as conn:
        rows = conn.execute(
            select(o.c.seq, o.c.body).where(o.c.node == node, o.c.seq > after).order_by(o.c.seq).limit(1000)
        ).all()
        orders = [dict(json.loads(r.body), seq=r.seq) for r in rows]
        starts = {str(x["job"]) for x in orders if x.get("kind") == "start"}
        ended: set[tuple[str, int]] = set()
        if starts:
            ended = {
                (r.job_id, r.attempt)
                for r in conn.execute(
                    select(a.c.job_id, a.c.attempt).where(a.c.job_id.in_(starts), a.c.state == "ended")
                )
            }
    for i, x in enumerate(orders):
        if x.get("kind") == "start" and (str(x["job"]), int(x["attempt"])) in ended:
            orders[i] = dict(stop_order(x["job"], x["attempt"], 0.0, StopWhy.ENDED, 0.0), seq=x["seq"])
    return orders


def apply_report(ctx: Context, node: str, rep: Report, conn: Connection) -> dict[str, Any]:
    a, j = schema.attempts, schema.jobs
    row = conn.execute(select(a).where(a.c.job_id == rep.job, a.c.attempt == rep.attempt)).first()
    if row is None or not placed_on(conn, [node], states=None, job=rep.job, attempt=rep.attempt):
        raise ApiError(404, f"no attempt {rep.attempt} of job {rep.job} on node {node}")
    if row.state == "ended":
        raise ApiError(409, f"attempt {rep.attempt} of job {rep.job} has ended", fix="kill its processes")
    if rep.status is ReportStatus.RUNNING:
        conn.execute(
            update(a)
            .where(a.c.job_id == rep.job, a.c.attempt == rep.attempt, a.c.state == "starting")
            .values(state="running")
        )
        conn.execute(
            update(j)
            .where(j.c.id == rep.job, j.c.attempt == rep.attempt, j.c.state == "starting")
            .values(state="running", version=j.c.version + 1, launch_losses=0)  # launched: the count restarts
        )
    elif rep.status is ReportStatus.EXITED:
        body: dict[str, Any] = {
            "event": "x.exit",
            "job": rep.job,
            "attempt": rep.attempt,
            "node": node,
            "exit_code": rep.exit_code,
            "rank": rep.rank,
        }
        body.update({k: str(v) for k in ("why", "message", "log_tail") if (v := getattr(rep, k))})
        ctx.journal(conn, [body])
    else:  # ReportStatus.CHECKPOINT
        when = time.time() - (rep.age_s or 0.0)
        if row.last_checkpoint is None or when > row.last_checkpoint:
            conn.execute(
                update(a)
                .where(a.c.job_id == rep.job, a.c.attempt == rep.attempt)
                .values(last_checkpoint=when)
            )
            ctx.journal(
                conn,
                [
                    {
                        "event": "x.checkpoint",
                        "job": rep.job,
                        "attempt": rep.attempt,
                        "at": when,
                        "step": rep.step,
                    }
                ],
            )
    return {"ok": True}
