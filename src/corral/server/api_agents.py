"""The node agents' routes (under `/v1`, docs/node-protocol.md): register, heartbeat, orders by
long poll from the outbox, reports. Thin: the rules are in `registration.py`, `agent_io.py` and
`liveness.py`; what the API process knows of each node between writes, in `node_status.py`."""

from __future__ import annotations

import asyncio
import contextlib
import time

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import ValidationError
from starlette.responses import Response

from corral.protocol import (
    MAX_CURSOR,
    PROTOCOL_VERSION,
    Heartbeat,
    Poll,
    Registration,
    Report,
    mismatch_message,
)
from corral.server.agent_io import apply_report, check_incarnation, orders_after
from corral.server.auth import Principal
from corral.server.caller import ctx_of, who_of
from corral.server.errors import ApiError
from corral.server.liveness import apply_gpu_health, apply_unclean, lease_for, set_responding
from corral.server.registration import register_node
from corral.server.responses import invalid_request, json_response

router = APIRouter()


def _agent(who: Principal, node: str, *, registering: bool = False) -> None:
    if who.role != "agent" and not who.is_admin:
        raise ApiError(403, "only an agent token may act for a node", fix="use the node's join token")
    if who.role == "agent" and who.node and who.node != node:
        raise ApiError(403, f"this agent token belongs to node {who.node}, not {node}")
    if who.role == "agent" and not who.node and not registering:  # else it could act for any node
        raise ApiError(403, "this join token is not bound to a node yet", fix="register the node first")


@router.post("/agents/register", tags=["agents"])
async def register(request: Request, reg: Registration) -> Response:
    """An agent joins: its node becomes `up` (a declared node whose inventory differs is drained)."""
    ctx, who = ctx_of(request), who_of(request)
    _agent(who, reg.node, registering=True)
    if reg.protocol != PROTOCOL_VERSION:
        raise ApiError(426, mismatch_message(reg.protocol), fix="upgrade the older of the two")
    # heard from now, before the row says `registered`: the liveness thread must not measure the
    # node's silence from the server's start (it would declare a joining node silent or lost)
    ctx.node_status.heard(reg.node)
    out = await ctx.write(lambda conn: register_node(ctx, who, reg, conn))
    if who.role == "agent" and not who.node:  # bound now: a lookup made before the commit is stale
        ctx.tokens.forget(who.token_id)
    ctx.node_status.joined(reg.node, out["incarnation"], dict(reg.unhealthy), out["state"] == "lost")
    ctx.invalidate_model()
    return json_response(out)


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
    status = ctx.node_status
    if node in status.lost:
        raise ApiError(
            409, f"node {node} was declared lost (silent too long)", fix="the agent must register again"
        )
    if node in status.incarnations:
        check_incarnation(ctx, node, beat.incarnation)
    else:
        await run_in_threadpool(check_incarnation, ctx, node, beat.incarnation)
    status.heard(node)
    if node in status.silent:  # silent for a while, answering again: takes new work again
        await ctx.write(lambda conn: set_responding(ctx, conn, [node], True))
        status.answering(node)
        ctx.invalidate_model()
    if beat.gpus is not None:
        status.sampled(node, [g.model_dump() for g in beat.gpus])
    if beat.unclean is not None and bool(beat.unclean) != (node in status.unclean):
        stuck = list(beat.unclean)
        await ctx.write(lambda conn: apply_unclean(ctx, conn, node, stuck))
        ctx.invalidate_model()
    if beat.unhealthy is not None and beat.unhealthy != status.health(node):
        bad = dict(beat.unhealthy)
        await ctx.write(lambda conn: apply_gpu_health(ctx, conn, node, bad))
        status.health_written(node, bad)
        ctx.invalidate_model()
    return json_response({"ok": True, "lease_s": lease_for(ctx)})


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
            orders = await run_in_threadpool(orders_after, ctx, node, after)
            left = deadline - time.monotonic()
            if orders or left <= 0:
                return json_response({"orders": orders})
        elif left <= 0:
            return json_response({"orders": []})
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(woken.wait(), left)


@router.post("/agents/{node}/reports", tags=["agents"])
async def report(request: Request, node: str, rep: Report) -> Response:
    """An attempt's workers are running, or have exited (the scheduler then ends the attempt)."""
    ctx, who = ctx_of(request), who_of(request)
    _agent(who, node)
    await run_in_threadpool(check_incarnation, ctx, node, rep.incarnation)
    return json_response(await ctx.write(lambda conn: apply_report(ctx, node, rep, conn)))
