"""Configuration revisions (`/v1/config`, `/v1/policy`, `PUT /v1/queues/NAME`): read, replace,
change a queue or the policy, roll back. Every change is a new revision, checked as a cluster
file and against the live jobs (`server/config_check.py`) before it is stored; what members
see of the configuration is filtered like `GET /v1/queues` (agents see none of it)."""

from __future__ import annotations

import copy
import json
from typing import Any

from fastapi import APIRouter, Body, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field
from sqlalchemy import Connection, select
from starlette.responses import Response

from corral.core.errors import ConfigError
from corral.policies.registry import policy_arguments
from corral.server.auth import Principal
from corral.server.caller import ctx_of, require_admin, who_of
from corral.server.cluster import ClusterModel, apply_revision
from corral.server.config_check import LiveConflict
from corral.server.context import Context
from corral.server.errors import MAX_INT, ApiError
from corral.server.evidence import Decision, loads, vet
from corral.server.jobs import queues_of
from corral.server.responses import json_response
from corral.store import schema

router = APIRouter()
LIVE_CONFLICT = "config_conflicts_with_live_jobs"


class QueueChange(Decision):
    weight: float | None = Field(None, gt=0, le=1e6)
    quota: int | None = Field(None, ge=0, le=MAX_INT)
    limit: int | None = Field(None, ge=0, le=MAX_INT)
    cohort: str | None = None
    lending_limit: int | None = Field(None, ge=0, le=MAX_INT)
    teams: list[str] | None = None
    priorities: list[str] | None = None
    default_time_limit: str | None = None
    max_time_limit: str | None = None
    mount_allowlist: list[str] | None = None
    comment: str = ""


def _revise(
    ctx: Context, who: Principal, body: dict[str, Any], comment: str, conn: Connection, evidence: str = ""
) -> dict[str, Any]:
    try:
        revision = apply_revision(conn, body, who.name, comment, ctx.clock(), evidence)
    except LiveConflict as exc:
        raise ApiError(409, f"{exc.source}: {exc.detail}", fix=exc.fix, code=LIVE_CONFLICT) from None
    except ConfigError as exc:
        raise ApiError.of_config(exc) from None
    return {"revision": revision}


@router.put("/queues/{name}", tags=["queues"])
async def set_queue(request: Request, name: str, change: QueueChange) -> Response:
    """Change (or add) a queue: a new configuration revision, audited, that can be rolled back."""
    ctx, who = ctx_of(request), who_of(request)
    require_admin(who, "change a queue")
    model, _ = ctx.model()
    body = copy.deepcopy(model.body)
    queues = body.setdefault("queues", [])
    entry = next((q for q in queues if q.get("name") == name), None)
    if entry is None:
        entry = {"name": name}
        queues.append(entry)
    fields = change.model_dump(exclude_none=True, exclude={"comment", *Decision.model_fields})
    entry.update(fields)
    comment = change.comment or f"queue {name}: " + ", ".join(f"{k}={v}" for k, v in fields.items())
    evidence, note = vet(request, change)
    request.state.audit_detail = f"{comment}; {note}" if note else comment
    out = await ctx.write(lambda conn: _revise(ctx, who, body, comment, conn, evidence))
    ctx.invalidate_model()
    return json_response(out)


class PolicyChange(Decision):
    name: str = Field(description="a policy of `corral policies`: default, fifo, sjf, las")
    args: dict[str, dict[str, Any]] | None = Field(None, description="plugin arguments, by plugin")
    comment: str = ""


@router.put("/policy", tags=["config"])
async def set_policy(request: Request, change: PolicyChange) -> Response:
    """Change the scheduling policy: a new configuration revision (rolled back like any other)."""
    ctx, who = ctx_of(request), who_of(request)
    require_admin(who, "change the policy")
    model, _ = ctx.model()
    body = copy.deepcopy(model.body)
    body["policy"] = change.name
    if change.args is not None:
        body["policy_args"] = change.args
    else:
        body.pop("policy_args", None)
    comment = change.comment or f"policy {change.name}"
    evidence, note = vet(request, change)
    request.state.audit_detail = f"{comment}; {note}" if note else comment
    out = await ctx.write(lambda conn: _revise(ctx, who, body, comment, conn, evidence))
    ctx.invalidate_model()
    return json_response(out)


@router.get("/policy", tags=["config"])
async def get_policy(request: Request) -> Response:
    """The scheduling policy in effect: its name, the arguments given, every plugin's arguments as
    they take effect, and where it comes from (a configuration revision, or the server's --policy)."""
    ctx = ctx_of(request)
    _no_agents(who_of(request))
    model, _ = ctx.model()
    name = str(model.body.get("policy") or ctx.policy)
    given = model.body.get("policy_args") or {}
    try:
        effective = policy_arguments(name, given)
    except ConfigError as exc:  # a revision is checked when stored: only a bad --policy gets here
        raise ApiError.of_config(exc, 500) from None
    source = f"configuration revision {model.revision}" if "policy" in model.body else "the server's --policy"
    return json_response(
        {"name": name, "args": given, "plugins": effective, "revision": model.revision, "source": source}
    )


def _no_agents(who: Principal) -> None:
    if who.role == "agent":  # an agent learns what it needs from its registration and orders
        raise ApiError(403, "agent tokens may not read the configuration", fix="use a member or admin token")


def config_view(model: ClusterModel, who: Principal) -> dict[str, Any]:
    """The configuration as `who` may see it: members, only their team's queues (as `/v1/queues`)."""
    if who.is_admin:
        return dict(model.body)
    visible = set(queues_of(model, who))
    # webhook sinks (URLs, where their secrets live) are for admins only
    body = {k: v for k, v in model.body.items() if k not in ("queues", "notify")}
    body["queues"] = [q for q in model.body.get("queues", []) if q.get("name") in visible]
    return body


@router.get("/config", tags=["config"])
async def get_config(request: Request) -> Response:
    """The active cluster configuration (the cluster file as JSON) and its revision; members see
    their team's queues only. `refused`: the last revision the scheduler could not apply, and why."""
    who = who_of(request)
    _no_agents(who)
    model, _ = ctx_of(request).model()
    out: dict[str, Any] = {"revision": model.revision, "config": config_view(model, who)}
    if model.refused is not None:
        out["refused"] = model.refused if who.is_admin else {"revision": model.refused.get("revision")}
    return json_response(out)


@router.put("/config", tags=["config"])
async def put_config(
    request: Request,
    config: dict[str, Any] = Body(...),
    comment: str = Query(""),
    force: bool = Query(False, description="apply without a what-if where the server requires one"),
    reason: str = Query("", max_length=2000, description="why it is forced (kept with the revision)"),
) -> Response:
    """Replace the configuration with a new cluster file (validated first; nothing changes on error)."""
    ctx, who = ctx_of(request), who_of(request)
    require_admin(who, "change the configuration")
    evidence, note = vet(request, Decision(force=force, reason=reason))
    text = comment or "configuration replaced"
    request.state.audit_detail = f"{text}; {note}" if note else text
    out = await ctx.write(lambda conn: _revise(ctx, who, config, text, conn, evidence))
    ctx.invalidate_model()
    return json_response(out)


def _revisions(ctx: Context, who: Principal) -> list[dict[str, Any]]:
    c = schema.config_revisions
    with ctx.engines.reader.connect() as conn:
        rows = conn.execute(
            select(c.c.id, c.c.created_at, c.c.author, c.c.comment, c.c.body, c.c.evidence).order_by(c.c.id)
        ).all()
    if not who.is_admin:  # who changed what (queue names, teams, values) is for admins
        return [{"revision": r.id, "created_at": r.created_at} for r in rows]
    out = []
    for r in rows:
        try:  # a revision stored behind the API's back may not be a cluster file at all
            body = json.loads(r.body)
        except ValueError:
            body = {}
        if not isinstance(body, dict):
            body = {}
        policy = body.get("policy") or ctx.policy  # the server's --policy when it names none
        out.append(
            {
                "revision": r.id,
                "created_at": r.created_at,
                "author": r.author,
                "comment": r.comment,
                "policy": policy,
                "policy_args": body.get("policy_args") or {},
                "evidence": loads(r.evidence),
            }
        )
    return out


@router.get("/config/revisions", tags=["config"])
async def revisions(request: Request) -> Response:
    """Every configuration revision, oldest first (`corral queues history`); authors and comments
    for admins only."""
    who = who_of(request)
    _no_agents(who)
    model, _ = ctx_of(request).model()
    return json_response(
        {"active": model.revision, "revisions": await run_in_threadpool(_revisions, ctx_of(request), who)}
    )


def _one_revision(ctx: Context, number: int) -> dict[str, Any]:
    c = schema.config_revisions
    with ctx.engines.reader.connect() as conn:
        r = conn.execute(select(c).where(c.c.id == number)).first()
    if r is None:
        raise ApiError(404, f"no configuration revision {number}", fix="see `corral queues history`")
    try:
        body = json.loads(r.body)
    except ValueError:
        body = {}
    return {
        "revision": r.id,
        "created_at": r.created_at,
        "author": r.author,
        "comment": r.comment,
        "config": body,
        "evidence": loads(r.evidence),
    }


@router.get("/config/revisions/{number}", tags=["config"])
async def one_revision(request: Request, number: int = Path(ge=0, le=MAX_INT)) -> Response:
    """One revision (admins): the configuration it holds, who made it, why, and its evidence
    (the what-if it was decided on, or the reason it was forced)."""
    ctx, who = ctx_of(request), who_of(request)
    require_admin(who, "read a configuration revision")
    return json_response(await run_in_threadpool(_one_revision, ctx, number))


class Rollback(BaseModel):
    revision: int = Field(ge=0, le=MAX_INT, description="a revision of `GET /v1/config/revisions`")


def _rollback(ctx: Context, who: Principal, revision: int, conn: Connection) -> dict[str, Any]:
    c = schema.config_revisions
    text = conn.execute(select(c.c.body).where(c.c.id == revision)).scalar()
    if text is None:
        raise ApiError(404, f"no configuration revision {revision}", fix="see `corral queues history`")
    return _revise(ctx, who, json.loads(text), f"rollback to revision {revision}", conn)


@router.post("/config/rollback", tags=["config"])
async def rollback(request: Request, body: Rollback) -> Response:
    """Make an earlier revision active again (as a new revision, so the history only grows)."""
    ctx, who = ctx_of(request), who_of(request)
    require_admin(who, "roll the configuration back")
    out = await ctx.write(lambda conn: _rollback(ctx, who, body.revision, conn))
    ctx.invalidate_model()
    return json_response(out)
