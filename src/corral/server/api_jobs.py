"""Jobs: submit, list, get, cancel, hold, release, requeue, events, reasons (under `/v1`)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Body, Header, Query, Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import select
from starlette.responses import Response

from corral.server import arrays, idempotency, metrics
from corral.server.auth import Principal
from corral.server.caller import ctx_of, who_of
from corral.server.context import Context
from corral.server.errors import MAX_CURSOR, ApiError
from corral.server.estimated import (
    ESTIMATED,
    array_fields,
    estimate_fields,
    new_job_fields,
    new_job_fields_now,
)
from corral.server.job_changes import change_job_state
from corral.server.job_views import PUBLIC_EVENTS
from corral.server.job_views import no_agents as _no_agents
from corral.server.job_views import placements as _placements
from corral.server.job_views import visible_job as _get
from corral.server.jobs import ACTIVE_STATES, NO_ESTIMATE, job_json, new_job_json, prepare
from corral.server.responses import json_response
from corral.store import schema

router = APIRouter(tags=["jobs"])

STATES = ("pending", "starting", "running", "stopping", "finished", "failed", "cancelled", "rejected")


@router.post("/jobs", status_code=201)
async def submit(
    request: Request,
    spec: dict[str, Any] = Body(..., description="a job spec (DESIGN.md 4.2)"),
    idempotency_key: str | None = Header(
        None,
        alias=idempotency.HEADER,
        description="a fresh value per submission: a retry with it returns the job it made (24 h)",
    ),
) -> Response:
    """Submit a job; 201 with the job object (200 with the same job for a retry with the same
    Idempotency-Key), or 422 with what to change (and 403 outside your team)."""
    body, status = await submit_job(ctx_of(request), who_of(request), spec, idempotency_key)
    return json_response(body, status)


async def submit_job(
    ctx: Context, who: Principal, spec: object, key_header: str | None = None
) -> tuple[dict[str, Any], int]:
    """Check a submission, write it in the next group commit, and answer the job object and its
    status: 201, or 200 for a retry of a keyed submission already written (server/idempotency.py)."""
    try:
        _no_agents(who)
        key = idempotency.parse(key_header, who.name, spec)
        if arrays.is_special(spec):  # an array or a dependency: server/arrays.py
            assert isinstance(spec, dict)
            made: dict[str, Any] | str | idempotency.Replay = await arrays.submit(ctx, who, spec, key)
        else:
            model, static = ctx.model()
            prepared = replace(prepare(model, static, spec, who, ctx.clock()), key=key)
            made = await ctx.write_many(ctx.insert_jobs, prepared)
        if isinstance(made, idempotency.Replay):
            if not made.same:
                assert key is not None
                raise idempotency.reused(key, made)
            out = await run_in_threadpool(_replayed, ctx, who, made.job_id)
            metrics.SUBMISSIONS.labels("200").inc()
            return out, 200
    except ApiError as exc:
        metrics.SUBMISSIONS.labels(str(exc.status)).inc()
        raise
    metrics.SUBMISSIONS.labels("201").inc()
    if not isinstance(made, str):  # a job array (its own object) or a job with a dependency
        made.update(await run_in_threadpool(_special_estimate, ctx, who, made))
        return made, 201
    estimate = new_job_fields_now(ctx.history, prepared.spec)
    if estimate is None:  # newly finished jobs to read first
        estimate = await run_in_threadpool(_new_estimate, ctx, prepared)
    return new_job_json(made, prepared, estimate), 201


def _new_estimate(ctx: Context, prepared: Any) -> dict[str, Any]:
    with ctx.engines.reader.connect() as conn:
        return new_job_fields(conn, ctx.history, prepared.spec)


def _special_estimate(ctx: Context, who: Principal, made: dict[str, Any]) -> dict[str, Any]:
    """The estimate fields of what `arrays.submit` made: an array's (`array_fields`), a job's."""
    if made.get("array"):
        with ctx.engines.reader.connect() as conn:
            return array_fields(conn, ctx.history, str(made["id"]))
    return _estimate_of(ctx, who, str(made["id"]), "pending")


def _replayed(ctx: Context, who: Principal, job_id: str) -> dict[str, Any]:
    """The job (or job array) a keyed submission made, as it is now."""
    found = _array_of(ctx, who, job_id)
    if found is not None:
        return found
    return _one(ctx, who, job_id)


def _one(ctx: Context, who: Principal, job_id: str) -> dict[str, Any]:
    """One job's object, with its run-time estimate (server/estimated.py)."""
    row, placement = _get(ctx, who, job_id)
    with ctx.engines.reader.connect() as conn:
        found = estimate_fields(conn, ctx.history, [row])
    return job_json(row, placement, found.get(row.id))


def _visible(who: Principal) -> Any:
    j = schema.jobs
    return None if who.is_admin else (j.c.team == who.team)


def _list(
    ctx: Context,
    who: Principal,
    state: list[str],
    queue: str | None,
    user: str | None,
    limit: int,
    after: int,
    before: int = 0,
    array: str | None = None,
) -> list[dict[str, Any]]:
    j = schema.jobs
    if before:  # newest first, below `before` (the dashboard's pages)
        q = select(j).where(j.c.seq > after, j.c.seq < before).order_by(j.c.seq.desc()).limit(limit)
    else:
        q = select(j).where(j.c.seq > after).order_by(j.c.seq).limit(limit)
    vis = _visible(who)
    if vis is not None:
        q = q.where(vis)
    if state:
        q = q.where(j.c.state.in_(state))
    if queue:
        q = q.where(j.c.queue == queue)
    if user:
        q = q.where(j.c.user == user)
    if array:
        q = q.where(j.c.array_id == array)
    with ctx.engines.reader.connect() as conn:
        rows = conn.execute(q).all()
        places = _placements(conn, rows)
        found = estimate_fields(conn, ctx.history, rows)
    return [dict(job_json(r, places.get((r.id, r.attempt)), found.get(r.id)), seq=r.seq) for r in rows]


@router.get("/jobs")
async def list_jobs(
    request: Request,
    state: list[str] = Query([], description="repeat to match several; 'active' means pending or live"),
    queue: str | None = None,
    user: str | None = None,
    limit: int = Query(500, ge=1, le=10_000),
    after: int = Query(0, ge=0, le=MAX_CURSOR, description="only jobs with a larger seq (paging)"),
    before: int = Query(
        0, ge=0, le=MAX_CURSOR, description="newest first, only jobs with a smaller seq (0: oldest first)"
    ),
    array: str | None = Query(None, description="only the tasks of this job array"),
) -> Response:
    """Jobs you may see (your team's; admins: all), oldest first (newest first with `before`)."""
    who = who_of(request)
    _no_agents(who)
    wanted: list[str] = []
    for s in state:
        if s == "active":
            wanted.extend(ACTIVE_STATES)
        elif s not in STATES:
            raise ApiError(422, f"unknown state {s!r}", fix=f"use one of: {', '.join(STATES)}, active")
        else:
            wanted.append(s)
    rows = await run_in_threadpool(
        _list, ctx_of(request), who, wanted, queue, user, limit, after, before, array
    )
    return json_response({"jobs": rows})


@router.get("/jobs/{job_id}")
async def get_job(request: Request, job_id: str) -> Response:
    """One job: state, placement, and the reason it is pending."""
    who = who_of(request)
    _no_agents(who)
    found = await run_in_threadpool(_array_of, ctx_of(request), who, job_id)
    if found is not None:  # a job array as one object: spec, cap, tasks per state
        return json_response(found)
    return json_response(await run_in_threadpool(_one, ctx_of(request), who, job_id))


def _array_of(ctx: Context, who: Principal, job_id: str) -> dict[str, Any] | None:
    if "_" in job_id:  # a task: an ordinary job
        return None
    with ctx.engines.reader.connect() as conn:
        row = arrays.array_row(conn, job_id, who)
        if row is None:
            return None
        return arrays.array_json(conn, row) | array_fields(conn, ctx.history, job_id)


def _history(ctx: Context, who: Principal, job_id: str) -> dict[str, Any]:
    _get(ctx, who, job_id)
    e, r = schema.events, schema.reasons
    with ctx.engines.reader.connect() as conn:
        events = [
            json.loads(x.body)
            for x in conn.execute(
                select(e.c.body).where(e.c.job == job_id, e.c.kind.in_(PUBLIC_EVENTS)).order_by(e.c.seq)
            )
        ]
        reasons = [
            {
                "t": x["t"],
                "code": x["code"],
                "message": x["message"],
                "at": x["at"],
            }  # Row.t: Row's tuple view
            for x in conn.execute(select(r).where(r.c.job_id == job_id).order_by(r.c.id)).mappings()
        ]
    return {"events": events, "reasons": reasons}


@router.get("/jobs/{job_id}/events")
async def job_events(request: Request, job_id: str) -> Response:
    """The job's events (DESIGN.md 4.6) and the history of the reasons it waited."""
    who = who_of(request)
    _no_agents(who)
    return json_response(await run_in_threadpool(_history, ctx_of(request), who, job_id))


# ---- state changes by users and operators ---------------------------------------------------
@router.post("/jobs/{job_id}/{action}")
async def change_job(request: Request, job_id: str, action: str) -> Response:
    """`cancel` (a running job is told to checkpoint and stop), `hold`, `release`, `requeue`."""
    if action not in ("cancel", "hold", "release", "requeue"):
        raise ApiError(404, f"no action {action!r} on jobs", fix="use cancel, hold, release or requeue")
    ctx, who = ctx_of(request), who_of(request)
    _no_agents(who)
    if await run_in_threadpool(_array_of, ctx, who, job_id) is not None:  # the whole array
        whole = await ctx.write(lambda conn: arrays.change_array(ctx, who, job_id, action, conn))
        return json_response(whole)
    changed = await ctx.write(lambda conn: change_job_state(ctx, who, job_id, action, conn))
    if changed["state"] in ESTIMATED:  # held or released: its estimate, as a read gives it
        changed.update(await run_in_threadpool(_estimate_of, ctx, who, job_id, changed["state"]))
    return json_response(changed)


def _estimate_of(ctx: Context, who: Principal, job_id: str, state: str) -> dict[str, Any]:
    """The job's estimate fields while it is still in `state` (else none)."""
    row, _ = _get(ctx, who, job_id)
    if row.state != state:
        return NO_ESTIMATE
    with ctx.engines.reader.connect() as conn:
        return estimate_fields(conn, ctx.history, [row]).get(row.id, NO_ESTIMATE)
