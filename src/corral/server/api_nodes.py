"""Nodes, for operators (under `/v1`): list them with their GPUs, cordon, uncordon, drain with a
deadline, undrain, forget. The agents' own routes are in `api_agents.py`."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field
from starlette.responses import Response

from corral.server.caller import ctx_of, require_admin, who_of
from corral.server.errors import ApiError
from corral.server.node_ops import forget_node, set_node_state
from corral.server.node_views import node_list
from corral.server.responses import json_response

router = APIRouter()


@router.get("/nodes", tags=["nodes"])
async def listnode_list(
    request: Request,
    gpus: bool = Query(False, description="add `gpu_list`: each GPU's state, job and NVML figures"),
) -> Response:
    """Every node with its state, GPUs allocated and free, health and heartbeat age."""
    ctx, who = ctx_of(request), who_of(request)
    return json_response({"nodes": await run_in_threadpool(node_list, ctx, who, gpus)})


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
    out = await ctx.write(
        lambda conn: set_node_state(ctx, who, name, action, body.deadline, body.reason, conn)
    )
    ctx.invalidate_model()
    return json_response(out)
