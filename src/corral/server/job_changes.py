"""A user's or an admin's change to one job: cancel, hold, release or requeue, guarded by the
job's state and version (a running job is stopped through `attempts.stop_attempt`). The jobs
route and the arrays service (`arrays.change_array`, for the tasks that are not pending) use it."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Connection, select, update

from corral.core.eventshape import ending_line
from corral.protocol import StopWhy
from corral.server.attempts import Stop, nodes_of, stop_attempt
from corral.server.auth import Principal
from corral.server.context import Context
from corral.server.errors import ApiError
from corral.server.jobs import job_json
from corral.store import schema


def change_job_state(
    ctx: Context, who: Principal, job_id: str, action: str, conn: Connection
) -> dict[str, Any]:
    """cancel, hold, release or requeue one job, guarded by its state; returns the job object."""
    j, a = schema.jobs, schema.attempts
    row = conn.execute(select(j).where(j.c.id == job_id)).first()
    if row is None or not (who.is_admin or row.team == who.team):
        raise ApiError(404, f"no job {job_id} that you may see", fix="list yours with `corral jobs`")
    now = ctx.clock()
    state = row.state
    guard = (j.c.id == job_id, j.c.version == row.version)
    if action in ("hold", "release"):
        if state != "pending":
            raise ApiError(
                409,
                f"job {job_id} is {state}; only a pending job can be {action}ed",
                fix="`corral requeue` a running job first" if action == "hold" else "",
            )
        changed = conn.execute(
            update(j).where(*guard).values(held=action == "hold", version=j.c.version + 1)
        ).rowcount
        if changed != 1:
            raise ApiError(409, f"job {job_id} changed meanwhile", fix="try again")
        ctx.journal(conn, [{"event": f"x.{action}", "job": job_id, "by": who.name}])
    elif action == "cancel" and state == "pending":
        changed = conn.execute(
            update(j)
            .where(*guard)
            .values(
                state="cancelled",
                end_time=now,
                version=j.c.version + 1,
                reason=f"cancelled by {who.name}",
                reason_code="cancel",
                reason_at=None,
            )
        ).rowcount
        if changed != 1:
            raise ApiError(409, f"job {job_id} changed meanwhile", fix="try again")
        ctx.journal(conn, [ending_line("cancel", now, job_id, None, f"cancelled by {who.name}")])
    elif state in ("starting", "running"):
        if action == "requeue" and not who.is_admin and row.team != who.team:
            raise ApiError(403, "only the job's team or an admin may requeue it")
        grace = json.loads(row.request)["checkpoint"]["grace"]
        kind = "cancel" if action == "cancel" else "requeue"
        placement = conn.execute(
            select(a.c.placement).where(a.c.job_id == job_id, a.c.attempt == row.attempt)
        ).scalar_one()
        stop = Stop(job_id, row.attempt, kind, who.name, now + grace, grace, StopWhy(kind))
        if not stop_attempt(conn, stop, nodes_of(json.loads(placement)), ctx.journal):
            raise ApiError(409, f"job {job_id} changed meanwhile", fix="try again")
    elif action == "requeue" and state == "pending":
        pass  # already waiting: nothing to do
    elif state == "stopping" and action == "cancel":
        changed = conn.execute(
            update(a)
            .where(a.c.job_id == job_id, a.c.attempt == row.attempt, a.c.state == "stopping")
            .values(stop_kind="cancel", stop_by=who.name)
        ).rowcount
        if changed != 1:
            raise ApiError(409, f"job {job_id} changed meanwhile", fix="try again")
    elif state == "stopping":
        raise ApiError(409, f"job {job_id} is already stopping", fix="wait for it to stop (`corral show`)")
    else:
        raise ApiError(409, f"job {job_id} is {state}: nothing to {action}")
    new = conn.execute(select(j).where(j.c.id == job_id)).one()
    return job_json(new)
