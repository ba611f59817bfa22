"""Nodes (list, cordon, drain with a deadline, undrain) and the agents' API (register,
heartbeat, assignments by long poll from the outbox, status reports), under `/v1`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field, ValidationError
from sqlalchemy import Connection, func, select, update
from starlette.responses import Response

from corral.config.gpu_models import normalise_gpu_model
from corral.core.model import NodeName, NodeSpec, NodeState
from corral.protocol import (
    HEARTBEAT_INTERVAL,
    PROTOCOL_VERSION,
    Heartbeat,
    LocalAttempt,
    Poll,
    Registered,
    Registration,
    Report,
    ReportStatus,
    StopWhy,
    mismatch_message,
    stop_order,
)
from corral.server.allocations import attempts_on, gpu_owners
from corral.server.attempts import requeue_attempt
from corral.server.auth import Principal
from corral.server.caller import ctx_of, require_admin, who_of
from corral.server.cluster import cluster_event, node_spec_of, node_values
from corral.server.context import Context
from corral.server.errors import MAX_CURSOR, ApiError
from corral.server.liveness import apply_gpu_health, apply_unclean, lease_for, set_responding
from corral.server.responses import invalid_request, json_response
from corral.store import schema

router = APIRouter()


# ---- nodes ---------------------------------------------------------------------------------
def _gpus_of(
    ctx: Context, row: Any, owners: dict[tuple[str, int], Any], who: Principal
) -> list[dict[str, Any]]:
    """Each GPU of a node: its state, what runs on it (job ids of other teams hidden from members),
    and its NVML utilisation and memory where the node reports them."""
    unhealthy = json.loads(row["unhealthy"])
    samples = {s["index"]: s for s in ctx.gpu_samples.get(row["name"], [])}
    out = []
    for gpu in range(row["gpus"]):
        owner = owners.get((row["name"], gpu))
        if str(gpu) in unhealthy:
            state = "unhealthy"
        elif owner is not None:
            state = "allocated"
        else:
            state = "free" if row["state"] == "up" else row["state"]
        entry: dict[str, Any] = {"index": gpu, "state": state}
        if str(gpu) in unhealthy:
            entry["reason"] = unhealthy[str(gpu)]
        if owner is not None:
            mine = who.is_admin or owner.team == who.team
            entry.update(queue=owner.queue, job=owner.job_id if mine else None)
            if mine:
                entry.update(attempt=owner.attempt, user=owner.user)
        sample = samples.get(gpu)
        if sample is not None:
            entry.update({k: v for k, v in sample.items() if k != "index" and v is not None})
        out.append(entry)
    return out


def _nodes(ctx: Context, who: Principal | None = None, with_gpus: bool = False) -> list[dict[str, Any]]:
    n, al = schema.nodes, schema.allocations
    now = time.monotonic()
    with ctx.engines.reader.connect() as conn:
        used: dict[str, int] = dict(
            conn.execute(select(al.c.node, func.count()).where(al.c.live == 1).group_by(al.c.node)).all()
        )
        rows = conn.execute(select(n).order_by(n.c.name)).mappings().all()
        owners = gpu_owners(conn) if with_gpus else {}
    out = []
    for row in rows:
        seen = ctx.heartbeats.get(row["name"])
        unhealthy = json.loads(row["unhealthy"])
        allocated = used.get(row["name"], 0)
        out.append(
            {
                "name": row["name"],
                "state": row["state"],
                "reason": row["reason"],
                "gpus": row["gpus"],
                "gpu_model": row["gpu_model"],
                "allocated": allocated,
                "unhealthy": unhealthy,
                "free": max(0, row["gpus"] - allocated - len(unhealthy))
                if row["state"] == "up" and row["responding"]
                else 0,
                "responding": bool(row["responding"]),
                "labels": json.loads(row["labels"]),
                "nvlink": json.loads(row["nvlink"]),
                "address": row["address"],
                "declared": bool(row["declared"]),
                "registered": bool(row["registered"]),
                "incarnation": row["incarnation"],
                "heartbeat_age_s": round(now - seen, 3) if seen is not None else None,
                "drain_deadline": row["drain_deadline"],
            }
        )
        if with_gpus and who is not None:
            out[-1]["gpu_list"] = _gpus_of(ctx, row, owners, who)
    return out


@router.get("/nodes", tags=["nodes"])
async def list_nodes(
    request: Request,
    gpus: bool = Query(False, description="add `gpu_list`: each GPU's state, job and NVML figures"),
) -> Response:
    """Every node with its state, GPUs allocated and free, health and heartbeat age."""
    ctx, who = ctx_of(request), who_of(request)
    return json_response({"nodes": await run_in_threadpool(_nodes, ctx, who, gpus)})


def _set_state(
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
        _drain_attempts(ctx, conn, name, deadline or 0.0, f"the drain of {name} ({who.name})")
    conn.execute(
        update(n).where(n.c.name == name).values(state=new.value, reason=why, updated_at=now, **values)
    )
    ctx.journal(conn, [{"event": "x.node", "node": name, "state": new.value, "by": who.name}])
    return {"name": name, "state": new.value, "reason": why}


def _drain_attempts(ctx: Context, conn: Connection, node: str, deadline: float, by: str) -> None:
    """Tell every attempt on the node to checkpoint and stop at the deadline; they are requeued."""
    for x in attempts_on(conn, node):
        requeue_attempt(ctx, conn, x.job, x.attempt, x.placement, x.grace, deadline, by, StopWhy.DRAIN)


class NodeChange(BaseModel):
    reason: str = ""
    deadline: float | None = Field(
        None, ge=0, le=366 * 86400, description="drain: seconds until running jobs are stopped"
    )


@router.post("/nodes/{name}/{action}", tags=["nodes"])
async def change_node(request: Request, name: str, action: str, body: NodeChange | None = None) -> Response:
    """`cordon` (no new work), `uncordon` (lift a cordon), `drain` (jobs checkpointed and requeued
    by the deadline), `undrain` (lift a drain or a cordon), `forget` (revoke the agent tokens bound
    to the node, so that a new join token may register it)."""
    if action not in ("cordon", "uncordon", "drain", "undrain", "forget"):
        raise ApiError(
            404, f"no action {action!r} on nodes", fix="use cordon, uncordon, drain, undrain or forget"
        )
    ctx, who = ctx_of(request), who_of(request)
    require_admin(who, f"{action} a node")
    if action == "forget":
        forgotten = await ctx.write(lambda conn: forget_node(ctx, conn, name))
        for token_id in forgotten["revoked"]:
            ctx.tokens.forget(token_id)
        return json_response(forgotten)
    body = body or NodeChange(deadline=None)
    out = await ctx.write(lambda conn: _set_state(ctx, who, name, action, body.deadline, body.reason, conn))
    ctx.invalidate_model()
    return json_response(out)


# ---- agents --------------------------------------------------------------------------------
def _agent(who: Principal, node: str, *, registering: bool = False) -> None:
    if who.role != "agent" and not who.is_admin:
        raise ApiError(403, "only an agent token may act for a node", fix="use the node's join token")
    if who.role == "agent" and who.node and who.node != node:
        raise ApiError(403, f"this agent token belongs to node {who.node}, not {node}")
    if who.role == "agent" and not who.node and not registering:  # else it could act for any node
        raise ApiError(403, "this join token is not bound to a node yet", fix="register the node first")


def _check_unclaimed(conn: Connection, node: str, token_id: str) -> None:
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
    conn.execute(update(n).where(n.c.name == name).values(agent_token=""))
    return {"name": name, "state": row.state, "reason": "", "revoked": ids}


def _register(ctx: Context, who: Principal, reg: Registration, conn: Connection) -> dict[str, Any]:
    n, t = schema.nodes, schema.tokens
    if who.role == "agent" and not who.node:  # a join token is bound to the first node that uses it
        _check_unclaimed(conn, reg.node, who.token_id)
        bound = conn.execute(
            update(t).where(t.c.id == who.token_id, t.c.node == "").values(node=reg.node)
        ).rowcount
        if bound != 1:
            raise ApiError(403, "this join token is already bound to another node")
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
    live, stale = _reconcile(ctx, conn, reg)
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
    _resend_stops(conn, reg.node, live)
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


def _resend_stops(conn: Connection, node: str, live: list[dict[str, Any]]) -> None:
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


def _reconcile(ctx: Context, conn: Connection, reg: Registration) -> tuple[list[dict[str, Any]], list[str]]:
    """The node's live attempts as the server knows them, against what the agent runs. Attempts
    the agent no longer runs (a reboot, a crash with the fence's kill) end as `lost`; workers of
    attempts that have ended must be killed before the node takes work again (`stale`)."""
    a = schema.attempts
    rows = conn.execute(select(a.c.job_id, a.c.attempt, a.c.placement).where(a.c.state != "ended")).all()
    live = [
        {"job": r.job_id, "attempt": r.attempt}
        for r in rows
        if reg.node in {p["node"] for p in json.loads(r.placement)}
    ]
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


@router.post("/agents/register", tags=["agents"])
async def register(request: Request, reg: Registration) -> Response:
    """An agent joins: its node becomes `up` (a declared node whose inventory differs is drained)."""
    ctx, who = ctx_of(request), who_of(request)
    _agent(who, reg.node, registering=True)
    if reg.protocol != PROTOCOL_VERSION:
        raise ApiError(426, mismatch_message(reg.protocol), fix="upgrade the older of the two")
    # heard from now, before the row says `registered`: the liveness thread must not measure the
    # node's silence from the server's start (it would declare a joining node silent or lost)
    ctx.heartbeats[reg.node] = time.monotonic()
    out = await ctx.write(lambda conn: _register(ctx, who, reg, conn))
    if who.role == "agent" and not who.node:  # bound now: a lookup made before the commit is stale
        ctx.tokens.forget(who.token_id)
    ctx.incarnations[reg.node] = out["incarnation"]
    ctx.heartbeats[reg.node] = time.monotonic()
    ctx.silent.discard(reg.node)
    ctx.gpu_health[reg.node] = dict(reg.unhealthy)
    if out["state"] != "lost":
        ctx.lost.discard(reg.node)
    ctx.invalidate_model()
    return json_response(out)


def _incarnation(ctx: Context, node: str, incarnation: int) -> None:
    known = ctx.incarnations.get(node)
    if known is None:
        with ctx.engines.reader.connect() as conn:
            known = conn.execute(
                select(schema.nodes.c.incarnation).where(schema.nodes.c.name == node)
            ).scalar()
        if known is None:
            raise ApiError(404, f"no node {node}", fix="register first")
        ctx.incarnations[node] = known
    if incarnation != known:
        raise ApiError(
            409,
            f"stale incarnation {incarnation} of node {node} (current: {known})",
            fix="the agent must register again",
        )


async def _plain_heartbeat(request: Request) -> Response:
    """`POST /v1/agents/{node}/heartbeat` without FastAPI's request handling (dependencies, body
    layers), which was a quarter of the API's CPU for the route 10,000 agents call 2,000 times a
    second: the same model and checks. Matched first; the declared route below keeps the route
    in the OpenAPI document."""
    try:
        beat = Heartbeat.model_validate_json(await request.body())
    except ValidationError as exc:
        raise invalid_request(exc.errors(), empty="body") from None
    return await heartbeat(request, request.path_params["node"], beat)


router.add_route("/agents/{node}/heartbeat", _plain_heartbeat, methods=["POST"], include_in_schema=False)


@router.post("/agents/{node}/heartbeat", tags=["agents"])
async def heartbeat(request: Request, node: str, beat: Heartbeat) -> Response:
    """Kept in memory only (DESIGN.md 6.4); answers with the lease the agent may assume."""
    ctx, who = ctx_of(request), who_of(request)
    _agent(who, node)
    if node in ctx.lost:
        raise ApiError(
            409, f"node {node} was declared lost (silent too long)", fix="the agent must register again"
        )
    if node in ctx.incarnations:
        _incarnation(ctx, node, beat.incarnation)
    else:
        await run_in_threadpool(_incarnation, ctx, node, beat.incarnation)
    ctx.heartbeats[node] = time.monotonic()
    if node in ctx.silent:  # silent for a while, answering again: takes new work again
        await ctx.write(lambda conn: set_responding(ctx, conn, [node], True))
        ctx.silent.discard(node)
        ctx.invalidate_model()
    if beat.gpus is not None:
        ctx.gpu_samples[node] = [g.model_dump() for g in beat.gpus]
    if beat.unclean is not None and bool(beat.unclean) != (node in ctx.unclean):
        stuck = list(beat.unclean)
        await ctx.write(lambda conn: apply_unclean(ctx, conn, node, stuck))
        ctx.invalidate_model()
    if beat.unhealthy is not None and beat.unhealthy != ctx.gpu_health.get(node, {}):
        bad = dict(beat.unhealthy)
        await ctx.write(lambda conn: apply_gpu_health(ctx, conn, node, bad))
        ctx.gpu_health[node] = bad
        ctx.invalidate_model()
    return json_response({"ok": True, "lease_s": lease_for(ctx)})


def _assignments(ctx: Context, node: str, after: int) -> list[dict[str, Any]]:
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


async def _plain_assignments(request: Request) -> Response:
    """`GET /v1/agents/{node}/assignments` without FastAPI's request handling (its dependency
    solving was half the route's cost, and 10,000 agents renew 333 long polls a second): the same
    checks. Matched first; the declared route below keeps the route in the OpenAPI document."""
    try:
        poll = Poll.model_validate(dict(request.query_params))
    except ValidationError as exc:
        raise invalid_request(exc.errors(), prefix="query.") from None
    return await assignments(request, request.path_params["node"], poll.after, poll.wait)


router.add_route("/agents/{node}/assignments", _plain_assignments, methods=["GET"], include_in_schema=False)


@router.get("/agents/{node}/assignments", tags=["agents"])
async def assignments(
    request: Request,
    node: str,
    after: int = Query(0, ge=0, le=MAX_CURSOR),
    wait: float = Query(0.0, ge=0, le=60),
) -> Response:
    """Start and stop orders for the node after `after`; waits up to `wait` s for one (long poll).
    The table is read only when the outbox cursor (`Context.outbox`) has an order for this node
    after `after`, so thousands of waiting polls cost nothing per commit but their own node's."""
    ctx, who = ctx_of(request), who_of(request)
    _agent(who, node)
    outbox = ctx.outbox
    deadline = time.monotonic() + wait
    while True:
        woken = outbox.mark(node)  # an order seen while we read must not wait for the timeout
        left = deadline - time.monotonic()
        # a poll that does not wait (or, on PostgreSQL, one at its deadline) reads the table anyway
        if outbox.has_after(node, after) or (left <= 0 and (wait == 0 or not outbox.exact)):
            orders = await run_in_threadpool(_assignments, ctx, node, after)
            left = deadline - time.monotonic()
            if orders or left <= 0:
                return json_response({"orders": orders})
        elif left <= 0:
            return json_response({"orders": []})
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(woken.wait(), left)


def _report(ctx: Context, node: str, rep: Report, conn: Connection) -> dict[str, Any]:
    a, j = schema.attempts, schema.jobs
    row = conn.execute(select(a).where(a.c.job_id == rep.job, a.c.attempt == rep.attempt)).first()
    if row is None or node not in {p["node"] for p in json.loads(row.placement)}:
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


@router.post("/agents/{node}/reports", tags=["agents"])
async def report(request: Request, node: str, rep: Report) -> Response:
    """An attempt's workers are running, or have exited (the scheduler then ends the attempt)."""
    ctx, who = ctx_of(request), who_of(request)
    _agent(who, node)
    await run_in_threadpool(_incarnation, ctx, node, rep.incarnation)
    return json_response(await ctx.write(lambda conn: _report(ctx, node, rep, conn)))
