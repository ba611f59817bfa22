"""What operators do to nodes: cordon, uncordon, drain (attempts stopped by the checkpoint
contract at the deadline and requeued), undrain, and forget (revoke its agent tokens)."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import Connection, select, update

from corral.core.model import NodeState
from corral.protocol import StopWhy
from corral.server.allocations import attempts_on
from corral.server.attempts import requeue_attempt
from corral.server.auth import Principal, tokens_changed
from corral.server.context import Context
from corral.server.errors import ApiError
from corral.store import schema


def set_node_state(
    ctx: Context,
    who: Principal,
    name: str,
    action: str,
    deadline: float | None,
    reason: str,
    conn: Connection,
) -> dict[str, Any]:
    n = schema.nodes
    row = conn.execute(select(n).where(n.c.name == name)).mappings().first()
    if row is None:
        raise ApiError(404, f"no node {name}", fix="list them with `corral nodes`")
    now = ctx.clock()
    if action == "uncordon" and row["state"] == NodeState.DRAINING.value:
        raise ApiError(
            409, f"{name} is draining, not cordoned", fix=f"end the drain with `corral nodes undrain {name}`"
        )
    if action == "uncordon" and row["state"] != NodeState.CORDONED.value:
        return {"name": name, "state": row["state"], "reason": row["reason"]}  # nothing to lift
    if action in ("undrain", "uncordon"):
        new, why = (NodeState.UP if row["registered"] else NodeState.DOWN), ""
        values: dict[str, Any] = {"drain_deadline": None}
    elif action == "cordon":
        new, why, values = NodeState.CORDONED, reason or f"cordoned by {who.name}", {}
    else:
        new, why = NodeState.DRAINING, reason or f"drained by {who.name}"
        values = {"drain_deadline": now + (deadline or 0.0)}
        drain_attempts(ctx, conn, name, deadline or 0.0, f"the drain of {name} ({who.name})")
    conn.execute(
        update(n).where(n.c.name == name).values(state=new.value, reason=why, updated_at=now, **values)
    )
    ctx.journal(conn, [{"event": "x.node", "node": name, "state": new.value, "by": who.name}])
    return {"name": name, "state": new.value, "reason": why}


def drain_attempts(ctx: Context, conn: Connection, node: str, deadline: float, by: str) -> None:
    """Tell every attempt on the node to checkpoint and stop at the deadline; they are requeued."""
    for x in attempts_on(conn, node):
        requeue_attempt(ctx, conn, x.job, x.attempt, x.placement, x.grace, deadline, by, StopWhy.DRAIN)


def forget_node(ctx: Context, conn: Connection, name: str) -> dict[str, Any]:
    """Revoke every live agent token bound to the node, so that a new join token may register it
    (a replaced host, a lost token). The node keeps its state and its attempts until a new agent
    registers (those it does not run end as `lost`) or it is declared lost after its silence."""
    n, t = schema.nodes, schema.tokens
    row = conn.execute(select(n.c.name, n.c.state).where(n.c.name == name)).first()
    if row is None:
        raise ApiError(404, f"no node {name}", fix="list them with `corral nodes`")
    ids = list(
        conn.execute(
            select(t.c.id).where(t.c.node == name, t.c.role == "agent", t.c.revoked_at.is_(None))
        ).scalars()
    )
    if ids:
        conn.execute(update(t).where(t.c.id.in_(ids)).values(revoked_at=time.time()))
        tokens_changed(conn)
    conn.execute(update(n).where(n.c.name == name).values(agent_token=""))
    return {"name": name, "state": row.state, "reason": "", "revoked": ids}
