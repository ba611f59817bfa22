"""A node agent joins (`POST /v1/agents/register`, docs/node-protocol.md 2): its join token bound
to the node, its row written or checked against the declared inventory, what it runs reconciled
with what the server knows (attempts it lost end as `lost`; workers of ended attempts make it
`lost` until they are gone: DESIGN.md 6.1), and the cursor its polls start after."""

from __future__ import annotations

import json
import time
from typing import Any

from sqlalchemy import Connection, func, select, update

from corral.config.gpu_models import normalise_gpu_model
from corral.core.model import NodeName, NodeSpec, NodeState
from corral.protocol import HEARTBEAT_INTERVAL, LocalAttempt, Registered, Registration
from corral.server.allocations import placed_on
from corral.server.auth import Principal, tokens_changed
from corral.server.cluster import cluster_event, node_spec_of, node_values
from corral.server.context import Context
from corral.server.errors import ApiError
from corral.server.liveness import apply_gpu_health, lease_for
from corral.store import schema


def check_unclaimed(conn: Connection, node: str, token_id: str) -> None:
    """A join token not bound to a node may register only a node that no live agent token holds:
    taking a node over (its orders, job env included, and its reports) needs an admin to forget
    the node first (`forget_node`), which revokes the tokens bound to it."""
    t = schema.tokens
    holder = conn.execute(
        select(t.c.id)
        .where(t.c.node == node, t.c.role == "agent", t.c.revoked_at.is_(None), t.c.id != token_id)
        .limit(1)
    ).first()
    if holder is not None:
        raise ApiError(
            403,
            f"node {node} is already bound to another agent token; a join token cannot take it over",
            fix=f"run the agent with that node's own token, or have an admin run `corral nodes forget {node}`"
            " (revokes the node's tokens) and register again",
        )


def register_node(ctx: Context, who: Principal, reg: Registration, conn: Connection) -> dict[str, Any]:
    n, t = schema.nodes, schema.tokens
    if who.role == "agent" and not who.node:  # a join token is bound to the first node that uses it
        check_unclaimed(conn, reg.node, who.token_id)
        bound = conn.execute(
            update(t).where(t.c.id == who.token_id, t.c.node == "").values(node=reg.node)
        ).rowcount
        if bound != 1:
            raise ApiError(403, "this join token is already bound to another node")
        tokens_changed(conn)
        ctx.tokens.forget(who.token_id)
    try:
        spec = NodeSpec(
            name=NodeName(reg.node),
            gpus=reg.gpus,
            gpu_model=normalise_gpu_model(reg.gpu_model) if reg.gpu_model else "",
            gpu_memory_gib=reg.gpu_memory_gib,
            cpus=reg.cpus,
            memory_gib=reg.memory_gib,
            labels=reg.labels,
            nvlink=tuple(tuple(g) for g in reg.nvlink),
            address=reg.address,
            network=reg.network,
        )
    except ValueError as exc:
        raise ApiError(
            422, f"registration of {reg.node}: {exc}", fix="send each GPU index in one nvlink group"
        ) from None
    row = conn.execute(select(n).where(n.c.name == reg.node)).mappings().first()
    now = time.time()
    state, reason = NodeState.UP, ""
    if row is None:
        if not ctx.allow_dynamic_nodes:
            raise ApiError(
                403,
                f"node {reg.node} is not declared in the cluster configuration",
                fix="declare it in the cluster file (or start the server with --allow-dynamic-nodes)",
            )
        conn.execute(
            schema.nodes.insert().values(
                name=reg.node,
                state="up",
                registered=True,
                incarnation=1,
                updated_at=now,
                logs_url=reg.logs_url,
                agent_token=who.token_id,
                **node_values(spec),
            )
        )
        incarnation = 1
        model, _ = ctx.model()
        ctx.journal(conn, [cluster_event(model, [spec])])
    else:
        incarnation = row["incarnation"] + 1
        declared = node_spec_of(row)
        values: dict[str, Any] = {
            "registered": True,
            "responding": True,
            "incarnation": incarnation,
            "updated_at": now,
            "address": reg.address,
            "logs_url": reg.logs_url,
            "agent_token": who.token_id,
        }
        if row["declared"] and (declared.gpus, declared.gpu_model) != (spec.gpus, spec.gpu_model):
            state = NodeState.DRAINING
            reason = (
                f"inventory mismatch: declared {declared.gpus} x {declared.gpu_model or 'GPU'}, "
                f"agent found {spec.gpus} x {spec.gpu_model or 'GPU'}"
            )
        elif not row["declared"]:
            values.update(node_values(spec))
        if row["state"] in ("cordoned", "draining") and state is NodeState.UP:
            state, reason = NodeState(row["state"]), row["reason"]
        conn.execute(update(n).where(n.c.name == reg.node).values(state=state.value, reason=reason, **values))
    live, stale = reconcile(ctx, conn, reg)
    if stale:  # DESIGN.md 6.1: readmitted only clean
        state = NodeState.LOST
        reason = "unclean: workers of ended attempts still run here (" + ", ".join(stale[:5]) + ")"
        conn.execute(update(n).where(n.c.name == reg.node).values(state=state.value, reason=reason))
    ctx.journal(
        conn, [{"event": "x.node", "node": reg.node, "state": state.value, "incarnation": incarnation}]
    )
    if reg.unhealthy or (row is not None and row["unhealthy"] not in ("", "{}")):
        apply_gpu_health(ctx, conn, reg.node, reg.unhealthy)
    # orders before this point are for attempts the agent runs (live) or that ended: an agent that
    # read them from the start would launch old attempts again
    after = conn.execute(
        select(func.max(schema.outbox.c.seq)).where(schema.outbox.c.node == reg.node)
    ).scalar()
    resend_stops(conn, reg.node, live)
    answer = Registered(
        node=reg.node,
        incarnation=incarnation,
        after=int(after or 0),
        live=[LocalAttempt(job=x["job"], attempt=x["attempt"]) for x in live],
        stale=stale,
        state=state.value,
        reason=reason,
        # several heartbeats per lease, so one lost request does not let the fence kill the workers
        heartbeat_interval_s=min(HEARTBEAT_INTERVAL, lease_for(ctx) / 4),
        lease_s=lease_for(ctx),
    )
    return answer.model_dump(mode="json")


def resend_stops(conn: Connection, node: str, live: list[dict[str, Any]]) -> None:
    """The stop orders of the node's live attempts that are stopping, sent again after the cursor
    a registration hands out (the agent reads on from there): a stop sent while the agent was
    down, or one the registration itself caused (an unhealthy GPU), still reaches the workers."""
    a, o = schema.attempts, schema.outbox
    keys = {(str(x["job"]), int(x["attempt"])) for x in live}
    if not keys:
        return
    rows = conn.execute(
        select(a.c.job_id, a.c.attempt).where(a.c.job_id.in_({j for j, _ in keys}), a.c.state == "stopping")
    ).all()
    stopping = {(r.job_id, r.attempt) for r in rows} & keys
    latest: dict[tuple[str, int], str] = {}
    if stopping:
        for r in conn.execute(select(o.c.body).where(o.c.node == node).order_by(o.c.seq.desc())):
            order = json.loads(r.body)
            key = (str(order.get("job")), int(order.get("attempt") or 0))
            if order.get("kind") == "stop" and key in stopping and key not in latest:
                latest[key] = r.body
                if len(latest) == len(stopping):
                    break
    for body in latest.values():
        conn.execute(o.insert().values(node=node, body=body))


def reconcile(ctx: Context, conn: Connection, reg: Registration) -> tuple[list[dict[str, Any]], list[str]]:
    """The node's live attempts as the server knows them, against what the agent runs. Attempts
    the agent no longer runs (a reboot, a crash with the fence's kill) end as `lost`; workers of
    attempts that have ended must be killed before the node takes work again (`stale`)."""
    live = [{"job": p.job, "attempt": p.attempt} for p in placed_on(conn, [reg.node])]
    running = {(x.job, x.attempt) for x in reg.running}
    gone = [x for x in live if (x["job"], x["attempt"]) not in running]
    if gone:
        message = f"node {reg.node} came back without the workers"
        ctx.journal(
            conn,
            [
                {
                    "event": "x.exit",
                    "job": x["job"],
                    "attempt": x["attempt"],
                    "node": reg.node,
                    "why": "lost",
                    "exit_code": None,
                    "rank": None,
                    "message": message,
                }
                for x in gone
            ],
        )
    known = {(x["job"], x["attempt"]) for x in live}
    stale = [f"{job}/{attempt}" for job, attempt in sorted(running - known)]
    return [x for x in live if (x["job"], x["attempt"]) in running], stale
