"""The scheduler process's reads of the database: the consistent snapshot its state is rebuilt
from, the journal tail it follows, and the rows a step needs (new pending jobs, the attempts that
exited, what starts are sent with). Plain queries, no scheduling."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, func, select

from corral.store import schema

JOURNAL_PAGE = 5000


class Row(dict[str, Any]):
    """A row whose fields may be read and set as attributes."""

    def __getattr__(self, name: str) -> Any:
        return self[name]

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value


def last_seq(conn: Connection) -> int:
    """The journal's newest sequence number (0: empty)."""
    e = schema.events
    return conn.execute(select(e.c.seq).order_by(e.c.seq.desc()).limit(1)).scalar() or 0


def live_attempts(conn: Connection) -> Sequence[Any]:
    """Every attempt that has not ended, with its job's spec."""
    j, a = schema.jobs, schema.attempts
    return conn.execute(
        select(
            a.c.job_id,
            a.c.attempt,
            a.c.state,
            a.c.placement,
            a.c.started_at,
            a.c.deadline,
            a.c.stop_by,
            a.c.last_checkpoint,
            j.c.spec,
        )
        .join(j, j.c.id == a.c.job_id)
        .where(a.c.state != "ended")
    ).all()


def pending_jobs(conn: Connection) -> Sequence[Any]:
    """Every pending job, in submission order, with what its reason and backoff were, and for
    one that ran before, when its last attempt ended (`requeued_at`: its current wait began
    then) and the seconds its attempts ran (`ran`: its attained service, per GPU)."""
    j, a = schema.jobs, schema.attempts
    ran = (
        select(
            a.c.job_id,
            func.max(a.c.ended_at).label("requeued_at"),
            func.sum(a.c.ended_at - a.c.started_at).label("ran"),
        )
        .join(j, j.c.id == a.c.job_id)
        .where(j.c.state == "pending", a.c.ended_at.is_not(None))
        .group_by(a.c.job_id)
        .subquery()
    )
    return conn.execute(
        select(
            j.c.spec,
            j.c.attempt,
            j.c.held,
            j.c.not_before,
            j.c.reason_code,
            j.c.reason,
            j.c.reason_at,
            j.c.id,
            j.c.array_id,
            j.c.dependency,
            ran.c.requeued_at,
            ran.c.ran,
        )
        .select_from(j.outerjoin(ran, ran.c.job_id == j.c.id))
        .where(j.c.state == "pending")
        .order_by(j.c.seq)
    ).all()


def lost_nodes(conn: Connection) -> list[tuple[str, str]]:
    """(node, reason) of the lost nodes whose attempts are to end (not an unclean node's: its
    live attempts are real)."""
    n = schema.nodes
    rows = conn.execute(select(n.c.name, n.c.reason).where(n.c.state == "lost")).all()
    return [(r.name, r.reason) for r in rows if not r.reason.startswith("unclean")]


def last_pause(conn: Connection) -> tuple[str, float | None]:
    """Who paused scheduling, and when (from the newest `x.pause` of the journal)."""
    e = schema.events
    body = conn.execute(
        select(e.c.body).where(e.c.kind == "x.pause").order_by(e.c.seq.desc()).limit(1)
    ).scalar()
    if body is None:
        return ("", None)
    entry = json.loads(body)
    return (str(entry.get("by", "")), entry.get("t"))


def journal_after(conn: Connection, after: int) -> Sequence[Any]:
    """Up to JOURNAL_PAGE journal entries after `after`: seq, kind, job, body."""
    e = schema.events
    return conn.execute(
        select(e.c.seq, e.c.kind, e.c.job, e.c.body)
        .where(e.c.seq > after)
        .order_by(e.c.seq)
        .limit(JOURNAL_PAGE)
    ).all()


def pending_rows(conn: Connection, ids: list[str]) -> Sequence[Any]:
    """Newly submitted jobs still pending: their spec and what the gates (`gates.py`) read."""
    j = schema.jobs
    return conn.execute(
        select(
            j.c.id, j.c.spec, j.c.attempt, j.c.held, j.c.not_before, j.c.reason, j.c.array_id, j.c.dependency
        ).where(j.c.id.in_(ids), j.c.state == "pending")
    ).all()


def stop_rows(conn: Connection, keys: list[tuple[str, int]]) -> dict[tuple[str, int], Row]:
    """Per live attempt of the jobs in `keys`: why it is stopping, and its job's restart counts."""
    a, j = schema.attempts, schema.jobs
    rows = conn.execute(
        select(
            a.c.job_id,
            a.c.attempt,
            a.c.state,
            a.c.stop_kind,
            a.c.stop_by,
            j.c.restarts,
            j.c.launch_losses,
            j.c.request,
        )
        .join(j, j.c.id == a.c.job_id)
        .where(a.c.job_id.in_({k[0] for k in keys}), a.c.state != "ended")
    ).all()
    out: dict[tuple[str, int], Row] = {}
    for row in rows:
        r = Row(row._asdict())
        r.max_restarts = json.loads(r.request).get("max_restarts", 3)
        out[(r.job_id, r.attempt)] = r
    return out


def start_extras(conn: Connection, ids: list[str]) -> dict[str, tuple[dict[str, Any], str, float]]:
    """Per job: its request, the user it runs as, when it was submitted."""
    j = schema.jobs
    rows = conn.execute(select(j.c.id, j.c.request, j.c.run_as, j.c.submit_time).where(j.c.id.in_(ids))).all()
    return {r.id: (json.loads(r.request), r.run_as, r.submit_time) for r in rows}


def node_row(conn: Connection, name: str) -> Any:
    return conn.execute(select(schema.nodes).where(schema.nodes.c.name == name)).mappings().first()
