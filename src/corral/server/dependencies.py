"""Job dependencies in the control plane: resolved and checked at submit, judged from the database.

At submit (inside the writing transaction, so ids cannot race) every target must be a job or an
array the submitter may see (else 422 naming it); `singleton` becomes `afterany` on every
earlier job of the same name and user that has not ended; a job that would wait for itself,
directly or through the jobs it names, is refused (422, the cycle spelled out). Stored on the
job row as JSON: `{"text": ..., "on": [[kind, target, is_array], ...]}`.

The scheduler (`server/gates.py`) judges conditions from the targets' rows: a job whose
conditions all hold is offered to the core; one with a condition that can never hold is
cancelled with the reason (Slurm's DependencyNeverSatisfied, never left waiting).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

from sqlalchemy import Connection, func, select

from corral.config.array_spec import (
    MET as MET,
)
from corral.config.array_spec import (
    NEVER as NEVER,
)
from corral.config.array_spec import (
    WAIT as WAIT,
)
from corral.config.array_spec import (
    Dependency,
    Progress,
    judge,
    never_sentence,
    waiting_sentence,
)
from corral.server.auth import Principal
from corral.server.errors import ApiError
from corral.store import schema

TERMINAL = ("finished", "failed", "cancelled", "rejected")
Condition = tuple[str, str, bool]  # kind, target id, whether the target is an array


def resolve(
    conn: Connection, dep: Dependency, who: Principal, own_ids: Sequence[str], name: str
) -> list[Condition]:
    """The conditions of `dep` for a new job (or array) whose ids will be `own_ids`."""
    j, arr = schema.jobs, schema.arrays
    out: list[Condition] = []
    for kind, target in dep.on:
        if target in own_ids:
            raise ApiError(
                422,
                f"dependency cycle: {target} would wait for itself ({kind}:{target})",
                fix="name jobs submitted before this one",
                code="dependency_cycle",
            )
        job = conn.execute(select(j.c.team).where(j.c.id == target)).first()
        array = None
        if job is None:
            array = conn.execute(select(arr.c.team).where(arr.c.id == target)).first()
        team = job.team if job is not None else array.team if array is not None else None
        if team is None or not (who.is_admin or team == who.team):
            raise ApiError(
                422,
                f"--dependency: no job or array {target} that you may see",
                fix="name an existing job id (`corral jobs --all`), e.g. afterok:j12",
                code="unknown_dependency",
            )
        out.append((kind, target, array is not None))
    if dep.singleton:
        if not name:
            raise ApiError(422, "--dependency singleton needs a job name", fix="give the job a --name")
        rows = conn.execute(
            select(j.c.id).where(j.c.name == name, j.c.user == who.name, j.c.state.not_in(TERMINAL))
        ).all()
        out += [("afterany", r.id, False) for r in rows if ("afterany", r.id, False) not in out]
    _refuse_cycles(conn, out, set(own_ids))
    return out


def _refuse_cycles(conn: Connection, conditions: list[Condition], own: set[str]) -> None:
    """Walk what the targets wait for; reaching one of `own` is a cycle (422 with the path)."""
    j = schema.jobs
    seen: set[str] = set()
    frontier = [(target, [target]) for _, target, _ in conditions]
    while frontier:
        target, path = frontier.pop()
        if target in own:
            raise ApiError(
                422,
                "dependency cycle: " + " -> ".join(["(this job)", *path]),
                fix="remove the dependency that closes the loop",
                code="dependency_cycle",
            )
        if target in seen:
            continue
        seen.add(target)
        for row in conn.execute(
            select(j.c.dependency).where((j.c.id == target) | (j.c.array_id == target), j.c.dependency != "")
        ):
            for _, nxt, _ in load(row.dependency):
                frontier.append((nxt, [*path, nxt]))


def dumps_conditions(dep: Dependency, conditions: list[Condition]) -> str:
    return json.dumps({"text": dep.text, "on": [list(c) for c in conditions]}) if conditions else ""


def load(text: str) -> list[Condition]:
    if not text:
        return []
    return [(str(k), str(t), bool(a)) for k, t, a in json.loads(text)["on"]]


def text_of(stored: str) -> str:
    """The dependency as submitted (for the job object), "" for none."""
    return str(json.loads(stored)["text"]) if stored else ""


def progress(conn: Connection, conditions: Iterable[Condition]) -> dict[str, Progress]:
    """Where each target stands, read from the jobs table (arrays counted task by task)."""
    j = schema.jobs
    jobs = {t for _, t, a in conditions if not a}
    arrays = {t for _, t, a in conditions if a}
    out: dict[str, Progress] = {}
    for key, col in ((jobs, j.c.id), (arrays, j.c.array_id)):
        if not key:
            continue
        counts: dict[str, tuple[int, int, int, int]] = {}
        times: dict[str, tuple[float | None, float | None]] = {}
        for row in conn.execute(
            select(
                col.label("k"),
                j.c.state,
                func.count(),
                func.count(j.c.start_time),
                func.max(func.coalesce(j.c.start_time, j.c.end_time)),
                func.max(j.c.end_time),
            )
            .where(col.in_(sorted(key)))
            .group_by(col, j.c.state)
        ):
            tasks, started, finished, not_ok = counts.get(row.k, (0, 0, 0, 0))
            n, began = int(row[2]), int(row[3])
            ended = row.state in TERMINAL
            counts[row.k] = (
                tasks + n,
                started + (n if ended else began),
                finished + (n if row.state == "finished" else 0),
                not_ok + (n if ended and row.state != "finished" else 0),
            )
            start, end = times.get(row.k, (None, None))
            # a task that ended without starting (cancelled while pending) "started" when it ended
            times[row.k] = (_later(start, row[4]), _later(end, row[5] if ended else None))
        for k, (tasks, started, finished, not_ok) in counts.items():
            out[k] = Progress(tasks, started, finished, not_ok, *times[k])
    return out


def _later(*times: float | None) -> float | None:
    known = [float(t) for t in times if t is not None]
    return max(known) if known else None


def verdict(conditions: Sequence[Condition], known: dict[str, Progress]) -> tuple[str, str]:
    """(MET, "") when every condition holds; (NEVER, why) when one never can; else (WAIT, sentence)."""
    waiting = ""
    for kind, target, is_array in conditions:
        p = known.get(target, Progress(1, 0, 0, 1))  # a target gone from the database never finishes
        found = judge(kind, p)
        if found == NEVER:
            return NEVER, never_sentence(kind, target, is_array)
        if found == WAIT and not waiting:
            waiting = waiting_sentence(kind, target, is_array)
    return (WAIT, waiting) if waiting else (MET, "")


def pending_progress(conn: Connection, stored: Sequence[str]) -> dict[str, Progress]:
    return progress(conn, [c for text in stored for c in load(text)])
