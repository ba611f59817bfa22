"""A configuration revision checked against live work before it is stored (DESIGN.md 6.6).

Jobs that are pending, starting, running or stopping belong to a queue and a priority class;
the scheduler puts them back into its state under the revision in force, so a revision that
drops a queue or a priority class that such a job still uses cannot be applied. It is refused
(`LiveConflict`, answered 409) naming the jobs and how to drain them, and nothing is written.
The scheduler refuses such a revision too if one reaches the database another way
(`server/in_force.py`).
"""

from __future__ import annotations

import json
from collections import defaultdict

from sqlalchemy import Connection, select

from corral.config.cluster_file import ClusterConfig
from corral.core.errors import CorralError
from corral.store import schema

LIVE_JOB_STATES = ("pending", "starting", "running", "stopping")
MAX_NAMED = 10  # job ids named per queue or class in a refusal


class LiveConflict(CorralError):
    """The revision drops a queue or a priority class that live jobs still use. Shaped like
    ConfigError (source, detail, fix), not a subclass of it: the compiled core's ConfigError
    takes no subclasses defined outside the compiled modules."""

    def __init__(self, message: str, *, source: str, fix: str) -> None:
        self.source, self.detail, self.fix = source, message, fix
        super().__init__(f"{source}: {message} (fix: {fix})")


def live_uses(conn: Connection) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Live jobs by queue and by priority class: name -> ["j1 (running)", ...] in submit order."""
    j = schema.jobs
    rows = conn.execute(
        select(j.c.id, j.c.queue, j.c.state, j.c.spec).where(j.c.state.in_(LIVE_JOB_STATES)).order_by(j.c.seq)
    ).all()
    by_queue: dict[str, list[str]] = defaultdict(list)
    by_class: dict[str, list[str]] = defaultdict(list)
    for row in rows:
        label = f"{row.id} ({row.state})"
        by_queue[row.queue].append(label)
        by_class[str(json.loads(row.spec).get("priority_class", ""))].append(label)
    return by_queue, by_class


def _named(jobs: list[str]) -> str:
    shown = ", ".join(jobs[:MAX_NAMED])
    more = len(jobs) - MAX_NAMED
    return f"{shown} and {more} more" if more > 0 else shown


def _ids(jobs: list[str]) -> str:
    return " ".join(j.split(" ", 1)[0] for j in jobs[:MAX_NAMED])


def live_conflicts(conn: Connection, config: ClusterConfig) -> list[tuple[str, str]]:
    """(problem, fix) for each queue and priority class that `config` drops while live jobs use it."""
    by_queue, by_class = live_uses(conn)
    queues = {q.name for q in config.queues}
    classes = {c.name for c in config.priority_classes}
    out: list[tuple[str, str]] = []
    for name, jobs in by_queue.items():
        if name not in queues:
            out.append(
                (
                    f"queue {name} is not in it, but {len(jobs)} live job(s) use it: {_named(jobs)}",
                    f"keep queue {name} until its jobs end: cancel them (`corral cancel {_ids(jobs)}`) "
                    "or let them finish (jobs are never moved between queues); meanwhile `teams: []` "
                    "on the queue stops new submissions to it",
                )
            )
    for name, jobs in by_class.items():
        if name and name not in classes:
            out.append(
                (
                    f"priority class {name} is not in it, but {len(jobs)} live job(s) use it: {_named(jobs)}",
                    f"keep priority class {name} until those jobs end, or cancel them "
                    f"(`corral cancel {_ids(jobs)}`)",
                )
            )
    return out


def check_live(conn: Connection, config: ClusterConfig) -> None:
    """Raise LiveConflict when `config` cannot hold the live jobs (nothing is written)."""
    problems = live_conflicts(conn, config)
    if problems:
        raise LiveConflict(
            "; ".join(p for p, _ in problems),
            source="this configuration cannot replace the active one",
            fix="; ".join(f for _, f in problems),
        )
