"""Reading jobs as a caller may see them: who may use the jobs API, one job with its placement,
the placements of live attempts, the public event kinds. Shared by the jobs and logs routers."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, select

from corral.server.auth import Principal
from corral.server.context import Context
from corral.server.errors import ApiError
from corral.server.jobs import LIVE_STATES
from corral.store import schema

PUBLIC_EVENTS = (
    "cluster",
    "submit",
    "start",
    "preempting",
    "preempt",
    "lost",
    "restart",
    "finish",
    "fail",
    "cancel",
    "reject",
)


def no_agents(who: Principal) -> None:
    if who.role == "agent":
        raise ApiError(403, "agent tokens may not use the jobs API", fix="use a member or admin token")


def placements(conn: Connection, rows: Sequence[Any]) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """(job, attempt) -> the placement of each live job's attempt that has not ended."""
    a = schema.attempts
    keys = [(r.id, r.attempt) for r in rows if r.state in LIVE_STATES]
    if not keys:
        return {}
    found = conn.execute(
        select(a.c.job_id, a.c.attempt, a.c.placement).where(
            a.c.job_id.in_([k[0] for k in keys]), a.c.state != "ended"
        )
    ).all()
    return {(r.job_id, r.attempt): json.loads(r.placement) for r in found}


def visible_job(ctx: Context, who: Principal, job_id: str) -> tuple[Any, list[dict[str, Any]]]:
    """The job's row and its live placement; 404 when it does not exist or `who` may not see it."""
    j = schema.jobs
    with ctx.engines.reader.connect() as conn:
        row = conn.execute(select(j).where(j.c.id == job_id)).first()
        if row is None or not (who.is_admin or row.team == who.team):
            raise ApiError(404, f"no job {job_id} that you may see", fix="list yours with `corral jobs`")
        places = placements(conn, [row])
    return row, places.get((row.id, row.attempt), [])
