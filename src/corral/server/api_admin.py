"""Queues, the event log, audit, tokens, usage and admin verbs (`/v1`)."""

from __future__ import annotations

import pwd
import time
from typing import Any

from fastapi import APIRouter, Body, Query, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field
from sqlalchemy import Connection, and_, func, or_, select
from starlette.responses import Response

from corral.server.auth import ROLES, Principal, create_token, revoke_token
from corral.server.backup import backup
from corral.server.caller import ctx_of, require_admin, who_of
from corral.server.cluster import put_setting
from corral.server.context import Context
from corral.server.errors import MAX_CURSOR, ApiError
from corral.server.job_views import PUBLIC_EVENTS
from corral.server.jobs import queues_of
from corral.server.liveness import set_maintenance
from corral.server.responses import json_response
from corral.store import schema

router = APIRouter()


# ---- queues ----------------------------------------------------------------------------------
def _queues(ctx: Context, who: Principal) -> list[dict[str, Any]]:
    model, _ = ctx.model()
    visible = set(queues_of(model, who))
    j, al = schema.jobs, schema.allocations
    with ctx.engines.reader.connect() as conn:
        used: dict[str, int] = dict(
            conn.execute(
                select(j.c.queue, func.count())
                .join(al, and_(al.c.job_id == j.c.id, al.c.attempt == j.c.attempt))
                .where(al.c.live == 1)
                .group_by(j.c.queue)
            ).all()
        )
        pending: dict[str, int] = dict(
            conn.execute(
                select(j.c.queue, func.count()).where(j.c.state == "pending").group_by(j.c.queue)
            ).all()
        )
    total = sum(n.gpus for n in model.config.nodes)
    weights = sum(q.weight for q in model.config.queues) or 1.0
    out = []
    for q in model.config.queues:
        if q.name not in visible:
            continue
        gpus = used.get(q.name, 0)
        out.append(
            {
                "name": q.name,
                "weight": q.weight,
                "quota": q.quota,
                "limit": q.limit,
                "cohort": q.cohort,
                "lending_limit": q.lending_limit,
                "teams": list(q.teams),
                "priorities": list(q.priorities),
                "default_time_limit": q.default_time_limit,
                "max_time_limit": q.max_time_limit,
                "mount_allowlist": list(q.mount_allowlist),
                "allocated_gpus": gpus,
                "pending_jobs": pending.get(q.name, 0),
                "share": round(gpus / total, 4) if total else 0.0,
                "fair_share": round(q.weight / weights, 4),
                "over_quota": max(0, gpus - q.quota),
            }
        )
    return out


@router.get("/queues", tags=["queues"])
async def list_queues(request: Request) -> Response:
    """Queues you may use, with GPUs allocated now, pending jobs, share against weight and quota."""
    return json_response({"queues": await run_in_threadpool(_queues, ctx_of(request), who_of(request))})


# ---- the event log ---------------------------------------------------------------------------
def _events(ctx: Context, who: Principal, after: int, limit: int) -> list[str]:
    e, j = schema.events, schema.jobs
    q = select(e.c.body).where(e.c.seq > after, e.c.kind.in_(PUBLIC_EVENTS)).order_by(e.c.seq).limit(limit)
    if not who.is_admin:
        q = q.where(or_(e.c.kind == "cluster", e.c.job.in_(select(j.c.id).where(j.c.team == who.team))))
    with ctx.engines.reader.connect() as conn:
        return [r.body for r in conn.execute(q)]


@router.get("/events", tags=["events"])
async def events(
    request: Request,
    after: int = Query(0, ge=0, le=MAX_CURSOR, description="only events with a larger seq"),
    limit: int = Query(1000, ge=1, le=10_000),
    wait: float = Query(0.0, ge=0, le=60, description="long poll: wait up to this many seconds for one"),
) -> Response:
    """The event log of DESIGN.md 4.6 (yours: your team's jobs), one JSON object per event."""
    ctx, who = ctx_of(request), who_of(request)
    if who.role == "agent":
        raise ApiError(403, "agent tokens may not read the event log")
    deadline = time.monotonic() + wait
    while True:
        mark = ctx.notifier.mark()  # an event committed while we read must not wait for the timeout
        bodies = await run_in_threadpool(_events, ctx, who, after, limit)
        left = deadline - time.monotonic()
        if bodies or left <= 0:
            return Response("[" + ",".join(bodies) + "]", media_type="application/json")
        await ctx.notifier.wait(left, mark)


# ---- audit and tokens ------------------------------------------------------------------------
def _audit(
    ctx: Context, limit: int, after: int, who: str, action: str, since: float, until: float
) -> list[dict[str, Any]]:
    a = schema.audit
    q = select(a).where(a.c.id > after)
    if who:
        q = q.where(a.c.principal == who)
    if action:
        q = q.where(a.c.action.contains(action, autoescape=True))
    if since:
        q = q.where(a.c.t >= since)
    if until:
        q = q.where(a.c.t < until)
    with ctx.engines.reader.connect() as conn:
        rows = conn.execute(q.order_by(a.c.id.desc()).limit(limit)).mappings().all()
    return [dict(r) for r in reversed(rows)]


@router.get("/audit", tags=["admin"])
async def audit(
    request: Request,
    limit: int = Query(200, ge=1, le=10_000),
    after: int = Query(0, ge=0, le=MAX_CURSOR),
    who: str = Query("", max_length=200, description="only this principal's records"),
    action: str = Query("", max_length=200, description="only actions containing this, e.g. `/v1/nodes`"),
    since: float = Query(0.0, ge=0, description="only records at or after this Unix time"),
    until: float = Query(0.0, ge=0, description="only records before this Unix time (0: now)"),
) -> Response:
    """The newest audit records (who, what, result) that match, oldest first."""
    require_admin(who_of(request), "read the audit log")
    found = await run_in_threadpool(_audit, ctx_of(request), limit, after, who, action, since, until)
    return json_response({"audit": found})


class TokenRequest(BaseModel):
    name: str = Field(min_length=1, max_length=200)
    role: str = Field(description="admin, member or agent")
    team: str = ""
    node: str = Field(
        "", description="agent: bind to this node now (default: the first node that registers with it)"
    )
    run_as: str = Field(
        "",
        description="member: the Unix user the member's jobs run as (default: each node's default user); "
        "never root unless `allow_root`",
    )
    allow_root: bool = Field(
        False,
        description="accept `run_as` root: its jobs then run only on nodes whose agent has --allow-root-jobs",
    )


def is_root_user(name: str) -> bool:
    """True for root by name or number, and for any name that is uid 0 on this host."""
    if name.strip() in ("root", "0"):
        return True
    try:
        return pwd.getpwnam(name).pw_uid == 0
    except (KeyError, ValueError):
        return False


@router.post("/tokens", tags=["admin"], status_code=201)
async def make_token(request: Request, req: TokenRequest) -> Response:
    """Create a token; the secret is in this answer only."""
    ctx, who = ctx_of(request), who_of(request)
    require_admin(who, "create tokens")
    if req.role not in ROLES:
        raise ApiError(422, f"unknown role {req.role!r}", fix=f"use one of: {', '.join(ROLES)}")
    if req.role == "member" and not req.team:
        raise ApiError(422, "a member token needs a team", fix="give --team")
    if req.run_as and is_root_user(req.run_as) and not req.allow_root:
        raise ApiError(
            422,
            f"run_as {req.run_as!r} is root: jobs never run as root",
            fix="map the token to an unprivileged user (--run-as alice); if some nodes must run its jobs as "
            "root, add --allow-root here and start those nodes' agents with --allow-root-jobs",
        )
    request.state.audit_detail = f"{req.role} {req.name} team={req.team} node={req.node} run_as={req.run_as}"
    token_id, token = await ctx.write(
        lambda conn: create_token(
            conn, req.name, req.role, team=req.team, node=req.node, run_as=req.run_as, by=who.name
        )
    )
    return json_response(
        {"id": token_id, "token": token, "name": req.name, "role": req.role, "team": req.team}, 201
    )


def _tokens(ctx: Context) -> list[dict[str, Any]]:
    t = schema.tokens
    with ctx.engines.reader.connect() as conn:
        rows = conn.execute(select(t).order_by(t.c.created_at)).mappings().all()
    return [{k: v for k, v in r.items() if k != "hash"} for r in rows]


@router.get("/tokens", tags=["admin"])
async def list_tokens(request: Request) -> Response:
    """Every token (never the secret)."""
    require_admin(who_of(request), "list tokens")
    return json_response({"tokens": await run_in_threadpool(_tokens, ctx_of(request))})


@router.delete("/tokens/{token_id}", tags=["admin"])
async def delete_token(request: Request, token_id: str) -> Response:
    """Revoke a token at once."""
    ctx, who = ctx_of(request), who_of(request)
    require_admin(who, "revoke tokens")
    if not await ctx.write(lambda conn: revoke_token(conn, token_id)):
        raise ApiError(404, f"no live token {token_id}", fix="see `corral token list`")
    ctx.tokens.forget(token_id)
    return json_response({"revoked": token_id})


# ---- admin verbs -----------------------------------------------------------------------------
def _pause(ctx: Context, paused: bool, who: Principal, conn: Connection) -> dict[str, Any]:
    put_setting(conn, "scheduler.paused", "1" if paused else "0")
    ctx.journal(conn, [{"event": "x.pause" if paused else "x.resume", "by": who.name}])
    return {"paused": paused}


@router.post("/admin/{verb}", tags=["admin"])
async def admin_verb(request: Request, verb: str, body: dict[str, Any] | None = Body(None)) -> Response:
    """`pause` (decisions frozen, running jobs untouched), `resume`, `maintenance`
    (`{"seconds": 600}`: leases extended for a planned outage; 0 ends it), `backup` (`{"path": ...}`)."""
    ctx, who = ctx_of(request), who_of(request)
    require_admin(who, verb)
    if verb in ("pause", "resume"):
        return json_response(await ctx.write(lambda conn: _pause(ctx, verb == "pause", who, conn)))
    if verb == "maintenance":
        return json_response(await ctx.write(lambda conn: _maintenance(ctx, who, body or {}, conn)))
    if verb == "backup":
        path = (body or {}).get("path")
        if not isinstance(path, str) or not path:
            raise ApiError(
                422, "backup needs a path on the server", fix='send {"path": "/var/backups/corral.db"}'
            )
        return json_response(await run_in_threadpool(backup, ctx.engines, path))
    raise ApiError(404, f"no admin verb {verb!r}", fix="use pause, resume, maintenance or backup")


def _maintenance(ctx: Context, who: Principal, body: dict[str, Any], conn: Connection) -> dict[str, Any]:
    """Planned control-plane outage: leases last past its end, and no node is lost before then."""
    seconds = body.get("seconds")
    if not isinstance(seconds, int | float) or isinstance(seconds, bool) or not 0 <= seconds <= 86400:
        raise ApiError(
            422,
            "maintenance needs `seconds`: how long the control plane may be away (0 ends it), at most a day",
            fix='send {"seconds": 600}',
        )
    until = set_maintenance(ctx, conn, float(seconds))
    ctx.journal(conn, [{"event": "x.maintenance", "by": who.name, "until": until}])
    return {"maintenance_until": until or None}


def _usage(ctx: Context, who: Principal, since: float) -> list[dict[str, Any]]:
    a, j, al = schema.attempts, schema.jobs, schema.allocations
    now = time.time()
    with ctx.engines.reader.connect() as conn:
        gpus = (
            select(al.c.job_id, al.c.attempt, func.count().label("gpus"))
            .group_by(al.c.job_id, al.c.attempt)
            .subquery()
        )
        q = (
            select(j.c.queue, j.c.user, a.c.started_at, a.c.ended_at, gpus.c.gpus)
            .join(a, a.c.job_id == j.c.id)
            .join(gpus, and_(gpus.c.job_id == a.c.job_id, gpus.c.attempt == a.c.attempt))
            .where(or_(a.c.ended_at.is_(None), a.c.ended_at > since))
        )
        if not who.is_admin:
            q = q.where(j.c.team == who.team)
        rows = conn.execute(q).all()
    total: dict[tuple[str, str], float] = {}
    for r in rows:
        seconds = max(0.0, (r.ended_at or now) - max(r.started_at, since))
        total[(r.queue, r.user)] = total.get((r.queue, r.user), 0.0) + seconds * r.gpus / 3600.0
    return [{"queue": q, "user": u, "gpu_hours": round(h, 4)} for (q, u), h in sorted(total.items())]


@router.get("/usage", tags=["queues"])
async def usage(
    request: Request, since: float = Query(0.0, ge=0, le=1e12, description="Unix time")
) -> Response:
    """GPU-hours per queue and user since `since`, from the attempts the event log records."""
    who = who_of(request)
    if who.role == "agent":  # its empty team would match the jobs of admins, who have none
        raise ApiError(403, "agent tokens may not read usage", fix="use a member or admin token")
    return json_response({"usage": await run_in_threadpool(_usage, ctx_of(request), who, since)})
