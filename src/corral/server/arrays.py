"""Job arrays and dependent jobs at submit: one request, one transaction, N ordinary jobs.

An array `j12` of tasks 0..N-1 is written as N job rows `j12_0` ... (`j12` is the id of its
first task's sequence number; later plain jobs go on from `j{12+N}`), one `arrays` row (its
spec and `%N` cap), and N `submit` events carrying `array` and `array_task`, with one statement
per table. Each task is an ordinary job of one shared shape (the core's repeat shortcuts apply);
its environment gets `CORRAL_ARRAY_JOB_ID`, `CORRAL_ARRAY_TASK_ID` and Slurm's
`SLURM_ARRAY_JOB_ID`, `SLURM_ARRAY_TASK_ID`, `SLURM_ARRAY_TASK_COUNT`, `_MIN` and `_MAX`.
Tasks beyond the cap, and jobs whose dependency does not hold yet, wait outside the core
(`server/gates.py`) with a reason that says what they wait for.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from sqlalchemy import Connection, func, select, update

from corral.config.array_spec import ArraySpec, Dependency, parse_array, parse_dependency
from corral.core.errors import ConfigError
from corral.core.model import JobId
from corral.server import dependencies
from corral.server.auth import Principal
from corral.server.context import Context
from corral.server.errors import ApiError
from corral.server.idempotency import Key, Replay, find, record
from corral.server.job_changes import change_job_state
from corral.server.jobs import Prepared, _job_row, new_job_json, prepare, submit_event
from corral.store import schema
from corral.store.engine import append_events, insert_rows

ARRAY_LIMIT_CODE = "array_limit"
DEPENDENCY_CODE = "dependency"


def is_special(body: object) -> bool:
    """Whether a submission carries an array or a dependency (and so is written here)."""
    return isinstance(body, dict) and bool(body.get("array") or body.get("dependency"))


def _options(body: dict[str, Any]) -> tuple[dict[str, Any], ArraySpec | None, Dependency | None]:
    rest = {k: v for k, v in body.items() if k not in ("array", "dependency")}
    array_text, dep_text = body.get("array") or None, body.get("dependency") or None
    try:
        for key, value in (("array", array_text), ("dependency", dep_text)):
            if value is not None and not isinstance(value, str):
                raise ConfigError(
                    f"must be a string, not {type(value).__name__}", where=key, fix="e.g. 0-9%2, afterok:j1"
                )
        array = parse_array(array_text, "array") if array_text is not None else None
        dep = parse_dependency(dep_text, "dependency") if dep_text is not None else None
    except ConfigError as exc:
        raise ApiError.of_config(exc) from None
    return rest, array, dep


async def submit(
    ctx: Context, who: Principal, body: dict[str, Any], key: Key | None = None
) -> dict[str, Any] | Replay:
    """Check a submission with `array` and/or `dependency`, write it in one transaction, answer it
    (or, for an Idempotency-Key seen before, the `Replay` of what that submission made)."""
    rest, array, dep = _options(body)
    model, static = ctx.model()
    now = ctx.clock()
    prepared = replace(prepare(model, static, rest, who, now), key=key)
    is_sqlite = ctx.engines.is_sqlite

    def write(conn: Connection) -> dict[str, Any] | Replay:
        if key is not None:
            hit = find(conn, [key], time.time()).get((key.user, key.key))
            if hit is not None:
                return Replay(hit[0], hit[1] == key.digest)
        out = _insert(conn, prepared, array, dep, who, now, is_sqlite)
        if key is not None:
            record(conn, [(key, str(out["id"]))], time.time())
        return out

    return await ctx.write(write)


def _insert(
    conn: Connection,
    prepared: Prepared,
    array: ArraySpec | None,
    dep: Dependency | None,
    who: Principal,
    now: float,
    is_sqlite: bool,
) -> dict[str, Any]:
    first = (conn.exec_driver_sql("SELECT max(seq) FROM jobs").scalar() or 0) + 1
    base = f"j{first}"
    tasks = array.indices if array is not None else (None,)
    ids = [base if t is None else f"{base}_{t}" for t in tasks]
    conditions: list[dependencies.Condition] = []
    stored = ""
    if dep is not None:
        conditions = dependencies.resolve(conn, dep, who, [*ids, base], prepared.spec.name)
        stored = dependencies.dumps_conditions(dep, conditions)
    _, waiting = dependencies.verdict(conditions, dependencies.progress(conn, conditions))
    cap = array.max_running if array is not None else 0
    rows, events = _rows(prepared, first, base, array, stored, waiting)
    if dep is not None:
        resolved = [list(c) for c in conditions]
        for event in events:
            event["dependency"] = resolved
    insert_rows(conn, "jobs", rows)
    append_events(conn, events, is_sqlite)
    if array is not None:
        conn.execute(
            schema.arrays.insert().values(
                id=base, spec=array.text, tasks=len(ids), max_running=cap, team=prepared.team, created_at=now
            )
        )
        return _array_json(base, array, prepared, rows[0], dep)
    out = new_job_json(base, prepared)
    out.update(dependency=dep.text if dep else "", reason=rows[0]["reason"])
    out["reason_code"] = rows[0]["reason_code"]
    return out


def _rows(
    prepared: Prepared, first: int, base: str, array: ArraySpec | None, stored: str, waiting: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The job rows and `submit` events of a submission's tasks (one task for a plain job).

    Tasks differ only by id, seq and index: their spec and request are written as JSON once,
    with unique placeholders that each task's values replace (10,000 `json.dumps` would cost
    most of the submission)."""
    mark = uuid.uuid4().hex
    id_mark, task_mark, seq_mark = f"{mark}i", f"{mark}t", 987_654_321_987_654
    spec = replace(prepared.spec, id=JobId(id_mark), seq=seq_mark)
    request = prepared.request
    if array is not None:
        request = {**request, "env": {**request.get("env", {}), **_array_env(base, task_mark, array)}}
    row0 = _job_row(seq_mark, id_mark, spec, replace(prepared, request=request))
    spec_text, request_text = str(row0["spec"]), str(row0["request"])
    event0 = submit_event(spec)
    tasks: Sequence[int | None] = array.indices if array is not None else (None,)
    cap = array.max_running if array is not None else 0
    cap_reason = _cap_sentence(base, cap) if cap else ""
    rows, events = [], []
    for position, task in enumerate(tasks):
        seq = first + position
        job_id = base if task is None else f"{base}_{task}"
        reason, code = (waiting, DEPENDENCY_CODE) if waiting else ("", "")
        if not waiting and cap and position >= cap:
            reason, code = cap_reason, ARRAY_LIMIT_CODE
        rows.append(
            {
                **row0, "seq": seq, "id": job_id,
                "spec": spec_text.replace(id_mark, job_id).replace(str(seq_mark), str(seq), 1),
                "request": request_text.replace(task_mark, str(task)) if task is not None else request_text,
                "array_id": base if array is not None else None, "array_task": task,
                "dependency": stored, "reason": reason, "reason_code": code,
            }
        )  # fmt: skip
        event = {**event0, "job": job_id}
        if array is not None:
            event.update(array=base, array_task=task)
        events.append(event)
    return rows, events


def _array_env(base: str, task: int | str, array: ArraySpec) -> dict[str, str]:
    values = {
        "ARRAY_JOB_ID": base,
        "ARRAY_TASK_ID": str(task),
        "ARRAY_TASK_COUNT": str(len(array.indices)),
        "ARRAY_TASK_MIN": str(array.indices[0]),
        "ARRAY_TASK_MAX": str(array.indices[-1]),
    }
    return {f"{prefix}_{k}": v for prefix in ("CORRAL", "SLURM") for k, v in values.items()}


def _cap_sentence(base: str, cap: int) -> str:
    task = "task" if cap == 1 else "tasks"
    return f"waits for a slot: array {base} runs at most {cap} {task} at once (%{cap})"


def _array_json(
    base: str, array: ArraySpec, prepared: Prepared, first_row: dict[str, Any], dep: Dependency | None
) -> dict[str, Any]:
    spec = prepared.spec
    return {
        "id": base,
        "array": True,
        "spec": array.text,
        "tasks": len(array.indices),
        "max_running": array.max_running,
        "first_task": first_row["id"],
        "name": spec.name,
        "queue": spec.queue,
        "user": spec.user,
        "team": prepared.team,
        "state": "pending",
        "states": {"pending": len(array.indices)},
        "replicas": spec.replicas,
        "gpus_per_replica": spec.gpus_per_replica,
        "dependency": dep.text if dep else "",
    }


# ---- reading and acting on an array as a whole ---------------------------------------------
def array_row(conn: Connection, array_id: str, who: Principal) -> Any:
    """The `arrays` row of `array_id` if the caller may see it, else None."""
    arr = schema.arrays
    row = conn.execute(select(arr).where(arr.c.id == array_id)).first()
    if row is None or not (who.is_admin or row.team == who.team):
        return None
    return row


def array_json(conn: Connection, row: Any) -> dict[str, Any]:
    """An array as one object: its spec, cap, and how many tasks are in each state."""
    j = schema.jobs
    states = {
        r.state: int(r[1])
        for r in conn.execute(
            select(j.c.state, func.count()).where(j.c.array_id == row.id).group_by(j.c.state)
        )
    }
    first = conn.execute(select(j).where(j.c.array_id == row.id).order_by(j.c.seq).limit(1)).first()
    return {
        "id": row.id,
        "array": True,
        "spec": row.spec,
        "tasks": row.tasks,
        "max_running": row.max_running,
        "first_task": first.id if first else "",
        "name": first.name if first else "",
        "queue": first.queue if first else "",
        "user": first.user if first else "",
        "team": row.team,
        "state": _summary_state(states),
        "states": states,
        "dependency": dependencies.text_of(first.dependency) if first else "",
    }


_ORDER = ("running", "stopping", "starting", "pending", "failed", "cancelled", "rejected", "finished")


def _summary_state(states: dict[str, int]) -> str:
    """One state for an array: the first of live, pending, then the worst ending."""
    return next((s for s in _ORDER if states.get(s)), "finished")


def _in_order(rows: Sequence[Any]) -> list[str]:
    """Task ids by their index (RETURNING gives no order)."""
    return sorted((str(r.id) for r in rows), key=lambda i: int(i.rsplit("_", 1)[1]))


def change_array(
    ctx: Context, who: Principal, array_id: str, action: str, conn: Connection
) -> dict[str, Any]:
    """cancel, hold or release every task of an array that it applies to (pending ones in bulk)."""
    row = array_row(conn, array_id, who)
    if row is None:
        raise ApiError(404, f"no job {array_id} that you may see", fix="list yours with `corral jobs`")
    j = schema.jobs
    now = ctx.clock()
    pending = (j.c.array_id == array_id, j.c.state == "pending")
    if action in ("hold", "release"):
        changed = conn.execute(
            update(j).where(*pending).values(held=action == "hold", version=j.c.version + 1).returning(j.c.id)
        ).all()  # exactly the tasks changed, even if the scheduler started one meanwhile
        ctx.journal(conn, [{"event": f"x.{action}", "job": i, "by": who.name} for i in _in_order(changed)])
    elif action == "cancel":
        reason = f"cancelled by {who.name}"
        changed = conn.execute(
            update(j)
            .where(*pending)
            .values(
                state="cancelled", end_time=now, version=j.c.version + 1, reason=reason,
                reason_code="cancel", reason_at=None,
            )
            .returning(j.c.id)
        ).all()  # fmt: skip
        entries = [{"event": "cancel", "t": now, "job": i, "reason": reason} for i in _in_order(changed)]
        ctx.journal(conn, entries)
        live = conn.execute(
            select(j.c.id).where(j.c.array_id == array_id, j.c.state.in_(("starting", "running", "stopping")))
        ).all()
        for r in live:
            try:
                change_job_state(ctx, who, r.id, "cancel", conn)
            except ApiError as exc:
                if exc.status != 409:
                    raise
    elif action == "requeue":
        for r in conn.execute(
            select(j.c.id).where(j.c.array_id == array_id, j.c.state.in_(("starting", "running")))
        ).all():
            change_job_state(ctx, who, r.id, "requeue", conn)
    return array_json(conn, row)
