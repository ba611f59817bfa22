"""`GET /v1/jobs/{id}/logs`: a rank's log, read from the node that ran it (`corral logs`).

Logs stay on the nodes. The server checks that the caller may see the job (its team, or an
admin), finds the node of the rank in the attempt's placement, and asks that node's agent, signing
the request with the hash of the agent's token (see `corral.agent.logserver`). Paging is by byte
offset, which is how `corral logs --follow` tails a running job.
"""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import urlencode

import httpx
from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import select
from starlette.responses import Response

from corral.client.signing import HEADER, signature
from corral.server.caller import ctx_of, who_of
from corral.server.context import Context
from corral.server.errors import MAX_INT, ApiError
from corral.server.job_views import no_agents, visible_job
from corral.store import schema

router = APIRouter(tags=["jobs"])
MAX_CHUNK = 1 << 20


def _where(ctx: Context, job_id: str, attempt: int | None, rank: int) -> tuple[int, str, str, str]:
    """(attempt, node, its logs URL, the hash its requests are signed with) of the rank's log."""
    a, n, t = schema.attempts, schema.nodes, schema.tokens
    with ctx.engines.reader.connect() as conn:
        q = select(a.c.attempt, a.c.placement).where(a.c.job_id == job_id)
        q = q.where(a.c.attempt == attempt) if attempt else q.order_by(a.c.attempt.desc()).limit(1)
        row = conn.execute(q).first()
        if row is None:
            raise ApiError(
                404,
                f"job {job_id} has no attempt {attempt}" if attempt else f"job {job_id} has not run yet",
                fix="logs exist once the job has started (`corral show` says where it stands)",
            )
        placement: list[dict[str, Any]] = json.loads(row.placement)
        if not 0 <= rank < len(placement):
            raise ApiError(
                404,
                f"job {job_id} has ranks 0 to {len(placement) - 1}, not {rank}",
                fix="pass --rank with one of them",
            )
        node = str(placement[rank]["node"])
        found = conn.execute(
            select(n.c.logs_url, t.c.hash)
            .select_from(n.outerjoin(t, t.c.id == n.c.agent_token))
            .where(n.c.name == node)
        ).first()
    if found is None or not found.logs_url or not found.hash:
        raise ApiError(
            503,
            f"node {node} has not said where it serves logs",
            fix="the node's agent must be running (it registers its log address when it starts)",
        )
    return int(row.attempt), node, str(found.logs_url), str(found.hash)


@router.get("/jobs/{job_id}/logs")
async def job_logs(
    request: Request,
    job_id: str,
    rank: int = Query(0, ge=0, le=MAX_INT, description="the replica whose log to read"),
    attempt: int | None = Query(None, ge=1, le=MAX_INT, description="default: the latest"),
    offset: int = Query(0, ge=0, le=1 << 62, description="byte offset to read from"),
    limit: int = Query(MAX_CHUNK, ge=0, le=MAX_CHUNK),
) -> Response:
    """Up to `limit` bytes of the rank's log from `offset`, as text; headers `X-Corral-Size` (the
    log's size now), `X-Corral-Attempt` and `X-Corral-Node`."""
    ctx, who = ctx_of(request), who_of(request)
    no_agents(who)
    await run_in_threadpool(visible_job, ctx, who, job_id)  # 404 unless the caller may see the job
    number, node, url, key = await run_in_threadpool(_where, ctx, job_id, attempt, rank)
    target = f"/logs/{job_id}/{number}/{rank}?" + urlencode({"offset": offset, "limit": limit})
    when = int(time.time())
    try:
        async with httpx.AsyncClient(timeout=10.0) as client:
            answer = await client.get(
                url + target, headers={HEADER: f"{when}:{signature(key, when, target)}"}
            )
    except httpx.HTTPError as exc:
        raise ApiError(
            503, f"node {node} did not answer for the logs ({exc})", fix="is its agent running?"
        ) from None
    if answer.status_code == 404:
        raise ApiError(
            404,
            f"node {node} has no log of rank {rank} of job {job_id} attempt {number}",
            fix="it may not have launched (see `corral show`), or its node's logs were removed",
        )
    if answer.status_code != 200:
        raise ApiError(502, f"node {node} refused the log request ({answer.status_code})")
    return Response(
        answer.content,
        media_type="text/plain; charset=utf-8",
        headers={
            "X-Corral-Size": answer.headers.get("X-Corral-Size", "0"),
            "X-Corral-Attempt": str(number),
            "X-Corral-Node": node,
        },
    )
