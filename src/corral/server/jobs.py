"""Submissions checked at the door, job rows, and the job JSON of DESIGN.md 4.7.

A submission is parsed as the job spec of DESIGN.md 4.2, resolved against the active cluster
configuration (queue, priority class, time limit, pack level), checked for the submitter's
rights (team, mount allowlist) and against the static capacity (section 4.8: a job that can
never fit is refused with 422 and the reason), then written with its `submit` event in one
transaction by the group-commit writer.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from sqlalchemy import Connection

from corral.config.job_spec import JobRequest, parse_job_spec, to_job_spec
from corral.core.errors import ConfigError
from corral.core.eventshape import submit_line
from corral.core.model import JobId, JobSpec, Launch, QueueName, Topology
from corral.core.rejections import explain as explain_never_fits
from corral.core.request import request_for
from corral.core.state import ClusterState
from corral.server.auth import Principal
from corral.server.cluster import ClusterModel
from corral.server.errors import ApiError
from corral.server.idempotency import Key, Replay, find, record
from corral.store.engine import append_events, dumps, insert_rows

LIVE_STATES = ("starting", "running", "stopping")
ACTIVE_STATES = ("pending", *LIVE_STATES)
# the job object's run-time estimate, where none applies (server/estimated.py fills them)
NO_ESTIMATE: dict[str, Any] = {
    "estimate": None,
    "estimate_drawn_on": None,
    "estimate_basis": None,
    "estimated_end": None,
    "reserved_start": None,
}


@dataclass(frozen=True)
class Prepared:
    """A checked submission, ready to be written (its id and sequence are given at write time)."""

    spec: JobSpec
    request: dict[str, Any]
    team: str
    run_as: str
    key: Key | None = None  # the client's Idempotency-Key (server/idempotency.py)


def queues_of(model: ClusterModel, who: Principal) -> list[str]:
    """The queues `who` may submit to and look at (admins: all)."""
    if who.is_admin:
        return [q.name for q in model.config.queues]
    return [q.name for q in model.config.queues if who.team and who.team in q.teams]


def prepare(model: ClusterModel, static: ClusterState, body: object, who: Principal, now: float) -> Prepared:
    """Parse and check a submission; ApiError (422, 403) says what to change."""
    try:
        request = parse_job_spec(body, "job spec")
    except ConfigError as exc:
        raise ApiError.of_config(exc) from None
    if not request.command:
        raise ApiError(
            422,
            "job spec: command: a job needs a command",
            fix='give the argv as a list, e.g. command: ["python", "train.py"], or after `--` on the CLI',
        )
    allowed = queues_of(model, who)
    default_queue = allowed[0] if allowed else model.default_queue
    try:
        spec = to_job_spec(
            request,
            job_id="new",
            seq=0,
            submit_time=now,
            cluster=model.config,
            default_queue=default_queue,
            user=who.name,
        )
    except ConfigError as exc:
        raise ApiError.of_config(exc) from None
    if spec.queue not in allowed:
        raise ApiError(
            403,
            f"team {who.team or '(none)'} may not submit to queue {spec.queue}",
            fix=f"submit to one of: {', '.join(allowed) or '(no queue: ask an admin to add your team)'}",
        )
    _check_mounts(model, request, spec.queue)
    never = explain_never_fits(static, spec, request_for(static, spec))
    if never is not None:
        raise ApiError(
            422, f"this job can never run on this cluster: {never.reason}", fix=never.fix, code="never_fits"
        )
    return Prepared(spec, request.model_dump(mode="json", warnings=False), who.team, who.run_as)


def _check_mounts(model: ClusterModel, request: JobRequest, queue: str) -> None:
    allow = model.config.queue(queue).mount_allowlist
    for i, mount in enumerate(request.mounts):
        source = os.path.normpath(mount.source)
        if not any(source == root or source.startswith(root.rstrip("/") + "/") for root in allow):
            raise ApiError(
                422,
                f"job spec: mounts[{i}].source: {mount.source} is not under queue {queue}'s mount_allowlist",
                fix=f"mount from under one of: {', '.join(allow)}"
                if allow
                else f"ask an admin to add a mount_allowlist to queue {queue}",
            )


def spec_json(spec: JobSpec) -> str:
    """The scheduling spec as JSON (by hand: `dataclasses.asdict` costs ~100 µs a job)."""
    data = {f: getattr(spec, f) for f in _SPEC_FIELDS}
    data["launch"] = spec.launch.value
    data["topology"] = {"pack": spec.topology.pack, "required": spec.topology.required}
    data["gpu_model"] = list(spec.gpu_model)
    data["node_selector"] = dict(spec.node_selector)
    return dumps(data)


_SPEC_FIELDS = tuple(f.name for f in fields(JobSpec))


def spec_from_json(text: str) -> JobSpec:
    data = json.loads(text)
    data["id"] = JobId(data["id"])
    data["queue"] = QueueName(data["queue"])
    data["launch"] = Launch(data["launch"])
    data["topology"] = Topology(**data["topology"])
    data["gpu_model"] = tuple(data["gpu_model"])
    return JobSpec(**data)


def insert_job(conn: Connection, prepared: Prepared, is_sqlite: bool) -> str | Replay:
    """Write one submission and its `submit` event; returns the new job's id."""
    return insert_jobs(conn, [prepared], is_sqlite)[0]


def insert_jobs(conn: Connection, batch: Sequence[Prepared], is_sqlite: bool) -> list[str | Replay]:
    """Write submissions and their `submit` events with one statement per table; returns the ids,
    or for a submission whose Idempotency-Key was seen before, the `Replay` of the job it made."""
    now = time.time()
    seen = find(conn, [p.key for p in batch if p.key is not None], now)
    first = (conn.exec_driver_sql("SELECT max(seq) FROM jobs").scalar() or 0) + 1
    rows, events, keys = [], [], []
    out: list[str | Replay] = []
    seq = first
    for prepared in batch:
        key = prepared.key
        hit = seen.get((key.user, key.key)) if key is not None else None
        if key is not None and hit is not None:
            out.append(Replay(hit[0], hit[1] == key.digest))
            continue
        job_id = f"j{seq}"
        spec = replace(prepared.spec, id=JobId(job_id), seq=seq)
        rows.append(_job_row(seq, job_id, spec, prepared))
        events.append(submit_event(spec))
        out.append(job_id)
        if key is not None:  # a retry of it in this same batch replays this job
            seen[(key.user, key.key)] = (job_id, key.digest)
            keys.append((key, job_id))
        seq += 1
    if rows:
        insert_rows(conn, "jobs", rows)
        append_events(conn, events, is_sqlite)
    record(conn, keys, now)
    return out


def _job_row(seq: int, job_id: str, spec: JobSpec, prepared: Prepared) -> dict[str, Any]:
    return dict(
        seq=seq,
        id=job_id,
        name=spec.name,
        queue=spec.queue,
        user=spec.user,
        team=prepared.team,
        run_as=prepared.run_as,
        state="pending",
        submit_time=spec.submit_time,
        spec=spec_json(spec),
        request=dumps(prepared.request),
    )


def submit_event(spec: JobSpec) -> dict[str, Any]:
    return submit_line(spec, spec.submit_time)


def job_json(
    row: Any, placement: list[dict[str, Any]] | None = None, estimate: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The job object of the API, `corral show --json` and `corral submit --json`; `estimate`: its
    run-time estimate's fields (server/estimated.py; `NO_ESTIMATE` by default)."""
    spec = json.loads(row.spec)
    request = json.loads(row.request)
    return {
        "id": row.id,
        "name": row.name,
        "state": row.state,
        "queue": row.queue,
        "user": row.user,
        "team": row.team,
        "attempt": row.attempt,
        "placement": placement or [],
        "reason": row.reason,
        "reason_code": row.reason_code,
        "reason_at": row.reason_at,  # the time the reason names (Unix time), or null
        "held": bool(row.held),
        "priority_class": spec["priority_class"],
        "priority": spec["priority"],
        "replicas": spec["replicas"],
        "gpus_per_replica": spec["gpus_per_replica"],
        "gpus": spec["replicas"] * spec["gpus_per_replica"],
        "time_limit": spec["time_limit"],
        "preemptible": spec["preemptible"],
        "launch": spec["launch"],
        "gpu_model": spec["gpu_model"],
        "topology": spec["topology"],
        "restarts": row.restarts,
        "submit_time": row.submit_time,
        "start_time": row.start_time,
        "end_time": row.end_time,
        "exit_code": row.exit_code,
        "command": request["command"],
        "max_restarts": request["max_restarts"],
        "array_id": row.array_id,  # a task of a job array (server/arrays.py), else null
        "array_task": row.array_task,
        "dependency": json.loads(row.dependency)["text"] if row.dependency else "",
        **(NO_ESTIMATE if estimate is None else estimate),
    }


def new_job_json(job_id: str, prepared: Prepared, estimate: dict[str, Any] | None = None) -> dict[str, Any]:
    """`job_json` of a job just submitted, built from what was checked (no JSON round trip)."""
    spec, request = prepared.spec, prepared.request
    return {
        "id": job_id, "name": spec.name, "state": "pending", "queue": spec.queue, "user": spec.user,
        "team": prepared.team, "attempt": 0, "placement": [], "reason": "", "reason_code": "",
        "reason_at": None, "held": False,
        "priority_class": spec.priority_class, "priority": spec.priority, "replicas": spec.replicas,
        "gpus_per_replica": spec.gpus_per_replica, "gpus": spec.gpus, "time_limit": spec.time_limit,
        "preemptible": spec.preemptible, "launch": spec.launch.value, "gpu_model": list(spec.gpu_model),
        "topology": {"pack": spec.topology.pack, "required": spec.topology.required}, "restarts": 0,
        "submit_time": spec.submit_time, "start_time": None, "end_time": None, "exit_code": None,
        "command": request["command"], "max_restarts": request["max_restarts"],
        "array_id": None, "array_task": None, "dependency": "",
        **(NO_ESTIMATE if estimate is None else estimate),
    }  # fmt: skip
