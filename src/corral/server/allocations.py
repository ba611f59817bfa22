"""Which jobs run where, read from the database and nowhere else:

- `attempt_nodes`, one row per node of an attempt (0-GPU attempts too), is the one answer to
  "which attempts run on node N" (`placed_on`): registration's reconcile, a report's check that
  the attempt runs on the reporting node, the master ports taken on a node, a drain;
- `allocations`, one row per GPU of a live attempt, answers "who holds GPU g of node N".

Neither decodes the placement JSON of the attempts, nor matches it as text."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, insert, select

from corral.core.model import ReplicaPlacement
from corral.store import schema

LIVE = ("starting", "running", "stopping")  # an attempt that has not ended
CHUNK = 500  # names per IN (...) list


@dataclass(frozen=True)
class Placed:
    """One node of an attempt."""

    job: str
    attempt: int
    node: str
    master: bool  # replica 0 runs here
    state: str  # the attempt's: starting, running, stopping, ended
    master_port: int | None


def record(conn: Connection, starts: Iterable[tuple[str, int, Sequence[ReplicaPlacement]]]) -> None:
    """The nodes of new attempts (job, attempt, placement), written with their attempt rows."""
    rows = [
        {"job_id": job, "attempt": attempt, "node": node, "master": node == placement[0].node}
        for job, attempt, placement in starts
        for node in dict.fromkeys(str(r.node) for r in placement)
    ]
    if rows:  # an empty executemany would insert one empty row
        conn.execute(insert(schema.attempt_nodes), rows)


def placed_on(
    conn: Connection,
    nodes: Iterable[str],
    *,
    states: Sequence[str] | None = LIVE,
    job: str | None = None,
    attempt: int | None = None,
    masters: bool = False,
) -> list[Placed]:
    """The attempts on `nodes`: those in `states` (any state for None), of one job or attempt when
    given, only where their replica 0 runs when `masters`. One row per (attempt, node)."""
    an, a = schema.attempt_nodes, schema.attempts
    names = sorted(set(nodes))
    out: list[Placed] = []
    for i in range(0, len(names), CHUNK):
        q = (
            select(an.c.job_id, an.c.attempt, an.c.node, an.c.master, a.c.state, a.c.master_port)
            .join(a, (a.c.job_id == an.c.job_id) & (a.c.attempt == an.c.attempt))
            .where(an.c.node.in_(names[i : i + CHUNK]))
            .order_by(an.c.node, an.c.job_id, an.c.attempt)
        )
        if states is not None:
            q = q.where(a.c.state.in_(list(states)))
        if job is not None:
            q = q.where(an.c.job_id == job)
        if attempt is not None:
            q = q.where(an.c.attempt == attempt)
        if masters:
            q = q.where(an.c.master.is_(True))
        out += [
            Placed(r.job_id, r.attempt, r.node, bool(r.master), r.state, r.master_port)
            for r in conn.execute(q)
        ]
    return out


def master_ports(conn: Connection, nodes: Iterable[str]) -> dict[str, set[int]]:
    """DESIGN.md 4.3: per node, the master ports that live attempts with replica 0 on it hold."""
    taken: dict[str, set[int]] = {node: set() for node in nodes}
    for p in placed_on(conn, taken, masters=True):
        if p.master_port is not None:
            taken[p.node].add(p.master_port)
    return taken


def gpu_owners(conn: Connection) -> dict[tuple[str, int], Any]:
    """(node, GPU) -> the live allocation's job, attempt, queue, team and user."""
    al, j = schema.allocations, schema.jobs
    rows = conn.execute(
        select(al.c.node, al.c.gpu, al.c.job_id, al.c.attempt, j.c.queue, j.c.team, j.c.user)
        .join(j, j.c.id == al.c.job_id)
        .where(al.c.live == 1)
    ).all()
    return {(r.node, r.gpu): r for r in rows}


@dataclass(frozen=True)
class OnNode:
    """A live attempt on a node: what it takes to stop it."""

    job: str
    attempt: int
    placement: list[dict[str, Any]]
    grace: float  # the job's checkpoint grace (s)


def attempts_on(conn: Connection, node: str, gpus: Iterable[int] | None = None) -> list[OnNode]:
    """The starting or running attempts on `node` (GPUs or not); only those holding one of `gpus`
    when given (an unhealthy GPU stops only its holders)."""
    keys = {(p.job, p.attempt) for p in placed_on(conn, [node], states=("starting", "running"))}
    if gpus is not None:
        al = schema.allocations
        holders = conn.execute(
            select(al.c.job_id, al.c.attempt).where(
                al.c.node == node, al.c.live == 1, al.c.gpu.in_(list(gpus))
            )
        ).all()
        keys &= {(r.job_id, r.attempt) for r in holders}
    if not keys:
        return []
    a, j = schema.attempts, schema.jobs
    rows = conn.execute(
        select(a.c.job_id, a.c.attempt, a.c.placement, j.c.request)
        .join(j, j.c.id == a.c.job_id)
        .where(a.c.job_id.in_(sorted({job for job, _ in keys})))
    ).all()
    return [
        OnNode(r.job_id, r.attempt, json.loads(r.placement), json.loads(r.request)["checkpoint"]["grace"])
        for r in sorted(rows, key=lambda r: (r.job_id, r.attempt))
        if (r.job_id, r.attempt) in keys
    ]
