"""Accounting (`GET /v1/acct`, `corral acct`): one row per job and attempt, like Slurm's `sacct`,
from the `jobs` and `attempts` tables (a job that never started is one row without an attempt).

Rows come in a stable order (job sequence, then attempt) and pages follow a cursor
(`next`: `SEQ.ATTEMPT` of the last row), so paging is exact while jobs are being added.
Members see their team's jobs; admins every job; agents none.

A row's `state` is the attempt's: `starting`, `running`, `stopping` while it lives; once ended,
how it ended (`finished`, `failed`, `cancelled`, `preempted`, `requeued`, `lost`, `restarted`);
a job without attempts has its own state (`pending`, `cancelled`, `rejected`, `failed`).
`--since`/`--until` keep rows active at some time in the window (`sacct -S/-E`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import ColumnElement, Connection, and_, false, func, or_, select
from starlette.responses import Response

from corral.server.auth import Principal
from corral.server.caller import ctx_of, who_of
from corral.server.context import Context
from corral.server.errors import ApiError
from corral.server.responses import json_response
from corral.store import schema

router = APIRouter(tags=["jobs"])

FIELDS = (
    "id", "attempt", "name", "user", "team", "queue", "state", "job_state", "submit", "start", "end",
    "elapsed", "wait", "gpus", "gpu_hours", "exit_code", "reason", "nodes",
)  # fmt: skip
ENDED = {
    "finish": "finished",
    "fail": "failed",
    "cancel": "cancelled",
    "preempt": "preempted",
    "lost": "lost",
    "restart": "restarted",
}
ENDINGS = tuple(ENDED)
j, a = schema.jobs, schema.attempts
NO_ATTEMPT = a.c.attempt.is_(None)


def _job_only(state: str) -> ColumnElement[bool]:
    return and_(NO_ATTEMPT, j.c.state == state)


def _ended(kind: str) -> ColumnElement[bool]:
    return a.c.end_kind == kind


# each state a row can have -> the rows that have it (in SQL, so that pages stay exact)
STATE_ROWS: dict[str, Callable[[], ColumnElement[bool]]] = {
    "pending": lambda: _job_only("pending"),
    "starting": lambda: a.c.state == "starting",
    "running": lambda: a.c.state == "running",
    "stopping": lambda: a.c.state == "stopping",
    "finished": lambda: _ended("finish"),
    "failed": lambda: or_(_ended("fail"), _job_only("failed")),
    "cancelled": lambda: or_(_ended("cancel"), _job_only("cancelled")),
    "rejected": lambda: _job_only("rejected"),
    "preempted": lambda: and_(_ended("preempt"), func.coalesce(a.c.stop_kind, "") != "requeue"),
    "requeued": lambda: and_(_ended("preempt"), a.c.stop_kind == "requeue"),
    "lost": lambda: _ended("lost"),
    "restarted": lambda: _ended("restart"),
}
STATES = tuple(STATE_ROWS)
STATES_HELP = f"repeat to match several: {', '.join(STATES)}"


def parse_cursor(text: str) -> tuple[int, int]:
    seq, sep, attempt = text.partition(".")
    if not (seq.isdigit() and attempt.isdigit() and sep) or len(text) > 40:
        raise ApiError(422, f"invalid cursor {text!r}", fix="pass the `next` of the previous page as it was")
    return int(seq), int(attempt)


def _query(who: Principal, f: dict[str, Any], after: tuple[int, int], limit: int) -> Any:
    cols = (
        j.c.seq, j.c.id, j.c.name, j.c.user, j.c.team, j.c.queue, j.c.state.label("job_state"),
        j.c.submit_time, j.c.end_time, j.c.exit_code.label("job_exit"), j.c.reason.label("job_reason"),
        j.c.spec, a.c.attempt, a.c.state.label("attempt_state"), a.c.placement, a.c.started_at,
        a.c.ended_at, a.c.end_kind, a.c.exit_code, a.c.stop_kind,
    )  # fmt: skip
    attempt = func.coalesce(a.c.attempt, 0)
    q = select(*cols).select_from(j.outerjoin(a, a.c.job_id == j.c.id))
    q = q.where(or_(j.c.seq > after[0], and_(j.c.seq == after[0], attempt > after[1])))
    if not who.is_admin:
        q = q.where(j.c.team == who.team)
    if f["user"]:
        q = q.where(j.c.user == f["user"])
    if f["queue"]:
        q = q.where(j.c.queue == f["queue"])
    if f["states"]:
        q = q.where(or_(false(), *(STATE_ROWS[s]() for s in f["states"])))
    if f["since"] is not None:
        q = q.where(
            or_(
                and_(NO_ATTEMPT, or_(j.c.end_time.is_(None), j.c.end_time >= f["since"])),
                and_(~NO_ATTEMPT, or_(a.c.ended_at.is_(None), a.c.ended_at >= f["since"])),
            )
        )
    if f["until"] is not None:
        q = q.where(or_(and_(NO_ATTEMPT, j.c.submit_time < f["until"]), a.c.started_at < f["until"]))
    return q.order_by(j.c.seq, attempt).limit(limit)


def _endings(
    conn: Connection, jobs: list[str]
) -> tuple[dict[tuple[str, int], str], dict[tuple[str, int], float]]:
    """For the page's jobs: each ended attempt's reason (from its ending event) and end time."""
    e = schema.events
    reasons: dict[tuple[str, int], str] = {}
    for job, body in conn.execute(select(e.c.job, e.c.body).where(e.c.job.in_(jobs), e.c.kind.in_(ENDINGS))):
        line = json.loads(body)
        if line.get("attempt") is not None:
            reasons[(job, int(line["attempt"]))] = str(line.get("reason") or "")
    ends = {
        (r.job_id, r.attempt): r.ended_at
        for r in conn.execute(select(a.c.job_id, a.c.attempt, a.c.ended_at).where(a.c.job_id.in_(jobs)))
        if r.ended_at is not None
    }
    return reasons, ends


def _row(
    r: Any, reasons: dict[tuple[str, int], str], ends: dict[tuple[str, int], float], now: float
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": r.id, "attempt": r.attempt, "name": r.name, "user": r.user, "team": r.team,
        "queue": r.queue, "job_state": r.job_state, "submit": r.submit_time,
    }  # fmt: skip
    if r.attempt is None:
        spec = json.loads(r.spec)
        end = r.end_time
        out.update(state=r.job_state, start=None, end=end, elapsed=0.0)
        out.update(
            wait=(end if end is not None else now) - r.submit_time,
            gpus=spec["replicas"] * spec["gpus_per_replica"],
        )
        out.update(exit_code=r.job_exit, reason=r.job_reason, nodes=[])
    else:
        placement = json.loads(r.placement)
        end = r.ended_at
        if end is None:
            state = r.attempt_state
        elif r.end_kind == "preempt" and r.stop_kind == "requeue":
            state = "requeued"
        else:
            state = ENDED.get(r.end_kind or "", r.end_kind or "ended")
        since = ends.get((r.id, r.attempt - 1), r.submit_time) if r.attempt > 1 else r.submit_time
        out.update(
            state=state, start=r.started_at, end=end, elapsed=(end if end is not None else now) - r.started_at
        )
        out.update(wait=max(0.0, r.started_at - since), gpus=sum(len(p.get("gpus", [])) for p in placement))
        out.update(exit_code=r.exit_code, reason=reasons.get((r.id, r.attempt), ""))
        out["nodes"] = list(dict.fromkeys(p["node"] for p in placement))
    out["gpu_hours"] = round(out["gpus"] * out["elapsed"] / 3600.0, 6)
    return {k: out[k] for k in FIELDS}


def acct_rows(
    ctx: Context, who: Principal, f: dict[str, Any], after: tuple[int, int], limit: int
) -> dict[str, Any]:
    """A page of rows and the cursor of the next page (None on the last page)."""
    now = time.time()
    with ctx.engines.reader.connect() as conn:
        found = conn.execute(_query(who, f, after, limit + 1)).all()
        page = found[:limit]
        reasons, ends = _endings(conn, sorted({r.id for r in page})) if page else ({}, {})
    rows = [_row(r, reasons, ends, now) for r in page]
    last = page[-1] if page else None
    more = len(found) > limit and last is not None
    return {"rows": rows, "next": f"{last.seq}.{last.attempt or 0}" if more and last is not None else None}


@router.get("/acct")
async def acct(
    request: Request,
    user: str | None = None,
    queue: str | None = None,
    state: list[str] = Query([], description=STATES_HELP),
    since: float | None = Query(None, ge=0, le=1e11, description="Unix time: rows active at or after it"),
    until: float | None = Query(None, ge=0, le=1e11, description="Unix time: rows active before it"),
    limit: int = Query(500, ge=1, le=5000),
    after: str = Query("0.0", max_length=40, description="the `next` of the previous page"),
) -> Response:
    """Accounting rows: one per job and attempt (`corral acct`), your team's (admins: all)."""
    who = who_of(request)
    if who.role == "agent":
        raise ApiError(403, "agent tokens may not read accounting", fix="use a member or admin token")
    for s in state:
        if s not in STATE_ROWS:
            raise ApiError(422, f"unknown state {s!r}", fix=f"use one of: {', '.join(STATES)}")
    if since is not None and until is not None and until <= since:
        raise ApiError(422, "until is not after since", fix="give an `until` later than `since`")
    filters = {"user": user, "queue": queue, "states": state, "since": since, "until": until}
    out = await run_in_threadpool(acct_rows, ctx_of(request), who, filters, parse_cursor(after), limit)
    return json_response(out)
