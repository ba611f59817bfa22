"""Which jobs run where: the allocations table, one row per GPU of a live attempt, is the one
answer to "what runs on node N" (never the placement JSON of the attempts)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, select

from corral.store import schema


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
    """A live attempt holding GPUs of a node: what it takes to stop it."""

    job: str
    attempt: int
    placement: list[dict[str, Any]]
    grace: float  # the job's checkpoint grace (s)


def attempts_on(conn: Connection, node: str, gpus: Iterable[int] | None = None) -> list[OnNode]:
    """The starting or running attempts that hold GPUs of `node` (only those of `gpus` when given)."""
    a, al, j = schema.attempts, schema.allocations, schema.jobs
    q = (
        select(a.c.job_id, a.c.attempt, a.c.placement, j.c.request)
        .join(al, (al.c.job_id == a.c.job_id) & (al.c.attempt == a.c.attempt))
        .join(j, j.c.id == a.c.job_id)
        .where(al.c.node == node, al.c.live == 1, a.c.state.in_(("starting", "running")))
    )
    if gpus is not None:
        q = q.where(al.c.gpu.in_(list(gpus)))
    return [
        OnNode(r.job_id, r.attempt, json.loads(r.placement), json.loads(r.request)["checkpoint"]["grace"])
        for r in conn.execute(q.distinct()).all()
    ]
