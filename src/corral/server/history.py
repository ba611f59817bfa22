"""The cluster's own recent history as a trace (`GET /v1/history`, `corral trace export`, `corral
whatif`): the event log of a window turned into the rows of DESIGN.md 4.5, the nodes as they were,
and the configuration in force.

A job belongs to the window when it was submitted in it. What it shows is what was observed up to
the window's end (`until`, default now):
- `finished`, `failed`, `cancelled` after running: the run time of its last attempt (the one that
  ended it) is its duration;
- `running` at the window's end: the run time so far (flagged: the replay ends it there);
- `pending` at the window's end after an earlier attempt: that attempt's run time (flagged);
- never started (pending, cancelled or failed while pending, rejected): left out of the trace,
  and counted, since nothing says how long it would have run.
Every row carries `observed` (which of these), `live_wait` (seconds from submission to its first
start) and `attempts`; readers of the trace form ignore those columns.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import Connection, and_, select
from starlette.responses import Response

from corral.server.caller import ctx_of, require_admin, who_of
from corral.server.context import Context
from corral.server.errors import ApiError
from corral.server.responses import json_response
from corral.store import schema

router = APIRouter()
KINDS = ("cluster", "submit", "start", "preempt", "lost", "restart", "finish", "fail", "cancel", "reject")
ENDS_ATTEMPT = ("preempt", "lost", "restart", "finish", "fail", "cancel")
TERMINAL = {"finish": "finished", "fail": "failed", "cancel": "cancelled", "reject": "rejected"}
MAX_WINDOW_DAYS = 90


@dataclass
class _Job:
    submit: dict[str, Any]
    first_start: float | None = None
    last_start: float | None = None  # the running attempt's start; None when none runs
    last_run: float | None = None  # run time of the last attempt that ended
    attempts: int = 0
    ended: str = ""  # terminal state, once ended
    preemptions: int = 0


@dataclass
class _Nodes:
    """Every node the window's `cluster` lines name, when it first appears, and what befell it."""

    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    joined: dict[str, float] = field(default_factory=dict)
    topology: list[str] = field(default_factory=list)

    def add(self, event: dict[str, Any], since: float) -> None:
        self.topology = list(event.get("topology") or self.topology)
        for node in event.get("nodes") or []:
            if node["name"] not in self.nodes and float(event["t"]) >= since and self.nodes:
                self.joined[node["name"]] = float(event["t"])
            self.nodes.setdefault(node["name"], node)


def _events(conn: Connection, since: float, until: float) -> list[dict[str, Any]]:
    e = schema.events
    before = conn.execute(
        select(e.c.body).where(e.c.kind == "cluster", e.c.t < since).order_by(e.c.seq.desc()).limit(1)
    ).scalar()
    rows = conn.execute(
        select(e.c.body).where(and_(e.c.t >= since, e.c.t < until, e.c.kind.in_(KINDS))).order_by(e.c.seq)
    ).scalars()
    out = [json.loads(before)] if before is not None else []
    out.extend(json.loads(body) for body in rows)
    return out


def _fold(events: list[dict[str, Any]], since: float) -> tuple[dict[str, _Job], _Nodes, list[dict[str, Any]]]:
    """Jobs submitted in the window (in submission order), the nodes, and the node losses seen."""
    jobs: dict[str, _Job] = {}
    nodes = _Nodes()
    lost: list[dict[str, Any]] = []
    placements: dict[str, list[str]] = {}
    for event in events:
        kind, t = event["event"], float(event.get("t", 0.0))
        if kind == "cluster":
            nodes.add(event, since)
            continue
        name = str(event.get("job"))
        if kind == "submit":
            jobs[name] = _Job(event)
            continue
        job = jobs.get(name)
        if job is None:  # submitted before the window
            continue
        if kind == "start":
            job.attempts += 1
            job.last_start = t
            job.first_start = t if job.first_start is None else job.first_start
            placements[name] = sorted({p["node"] for p in event.get("placement", [])})
        elif kind in ENDS_ATTEMPT and job.last_start is not None:
            job.last_run, job.last_start = t - job.last_start, None
            job.preemptions += kind == "preempt"
            if kind == "lost":
                lost.append({"t": t, "job": name, "nodes": placements.get(name, [])})
        if kind in TERMINAL:
            job.ended = TERMINAL[kind]
    return jobs, nodes, lost


def _row(job: _Job, origin: float, until: float) -> tuple[dict[str, Any] | None, str]:
    """The trace row of one job and what was observed of it (a row of None: left out)."""
    s = job.submit
    if job.ended in ("finished", "failed", "cancelled") and job.last_run is not None:
        observed, duration = job.ended, job.last_run
    elif not job.ended and job.last_start is not None:
        observed, duration = "running", until - job.last_start
    elif not job.ended and job.last_run is not None:
        observed, duration = "pending", job.last_run
    else:
        return None, (job.ended or "pending") + " before starting"
    row = {
        "job_id": s["job"],
        "submit_time": float(s["t"]) - origin,
        "duration": max(0.0, duration),
        "gpus": int(s["replicas"]) * int(s["gpus_per_replica"]),
        "queue": s.get("queue") or "",
        "replicas": int(s["replicas"]),
        "gpus_per_replica": int(s["gpus_per_replica"]),
        "priority": s.get("priority_class") or "",
        "gpu_model": "|".join(s.get("gpu_model") or []),
        "time_limit": s.get("time_limit"),
        "preemptible": bool(s.get("preemptible", True)),
        "checkpoint_interval": None,  # the log does not say how often a job checkpoints
        "user": s.get("user") or "",
        "observed": observed,
        "live_wait": None if job.first_start is None else job.first_start - float(s["t"]),
        "attempts": job.attempts,
        "preemptions": job.preemptions,
    }
    return row, observed


def _node_changes(conn: Connection, names: set[str], since: float, until: float) -> list[dict[str, Any]]:
    """Admin actions on nodes in the window (cordon, drain, undrain, forget), from the audit log."""
    a = schema.audit
    rows = conn.execute(
        select(a.c.t, a.c.action, a.c.target, a.c.result)
        .where(a.c.t >= since, a.c.t < until, a.c.action.like("% /v1/nodes/%"))
        .order_by(a.c.id)
    ).all()
    return [
        {"t": r.t, "node": r.target, "action": r.action.rsplit("/", 1)[-1], "result": r.result}
        for r in rows
        if r.target in names and str(r.result).startswith("2")
    ]


def history(ctx: Context, since: float, until: float) -> dict[str, Any]:
    """The export: trace rows, counts, the nodes as they were, and the configuration in force."""
    with ctx.engines.reader.connect() as conn:
        events = _events(conn, since, until)
        jobs, nodes, lost = _fold(events, since)
        changes = _node_changes(conn, set(nodes.nodes), since, until)
        states = {r.name: r.state for r in conn.execute(select(schema.nodes.c.name, schema.nodes.c.state))}
        c = schema.config_revisions
        revisions = [
            {"revision": r.id, "created_at": r.created_at, "comment": r.comment}
            for r in conn.execute(
                select(c.c.id, c.c.created_at, c.c.comment).where(
                    c.c.created_at >= since, c.c.created_at < until
                )
            )
        ]
    model, _ = ctx.model()
    origin = min((float(j.submit["t"]) for j in jobs.values()), default=since)
    rows, counts = [], {"submitted": len(jobs)}
    left_out: list[dict[str, str]] = []
    for job in jobs.values():
        row, observed = _row(job, origin, until)
        counts[observed] = counts.get(observed, 0) + 1
        if row is None:
            left_out.append({"job": job.submit["job"], "why": observed})
        else:
            rows.append(row)
    counts["exported"] = len(rows)
    node_list = [
        {**n, "state_now": states.get(n["name"], "forgotten"), "joined_at": nodes.joined.get(n["name"])}
        for n in nodes.nodes.values()
    ]
    return {
        "since": since,
        "until": until,
        "origin": origin,
        "counts": counts,
        "jobs": rows,
        "left_out": left_out,
        "topology": nodes.topology,
        "nodes": node_list,
        "node_changes": changes,
        "node_losses": lost,
        "config": model.body,
        "revision": model.revision,
        "policy": str(model.body.get("policy") or ctx.policy),
        "revisions_in_window": revisions,
    }


@router.get("/history", tags=["config"])
async def get_history(
    request: Request,
    since: float = Query(..., ge=0, description="the window's start (Unix seconds)"),
    until: float | None = Query(None, ge=0, description="the window's end (Unix seconds; default now)"),
) -> Response:
    """The event log of a window as a trace (DESIGN.md 4.5) with the nodes as they were and the
    configuration in force (`corral trace export`, `corral whatif`); admins only."""
    ctx, who = ctx_of(request), who_of(request)
    require_admin(who, "export the cluster's history")
    end = time.time() if until is None else until
    if end <= since:
        raise ApiError(
            422,
            f"the window ends ({end:.0f}) before it starts ({since:.0f})",
            fix="give --since before --until",
        )
    if end - since > MAX_WINDOW_DAYS * 86400:
        raise ApiError(422, f"the window is over {MAX_WINDOW_DAYS} days", fix="give a shorter --since")
    return json_response(await run_in_threadpool(history, ctx, since, end))
