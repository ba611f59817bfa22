"""Stopping an attempt, in one place: the attempt row (`stopping`, why, by whom, when the kill
comes), the job row (`stopping`), a stop order to each node of the attempt, and, for a stop
decided in the API process, the journal entry that tells the scheduler.

Used by the scheduler's commits (preemption), the jobs API (cancel, requeue), drains and GPU
health (`requeue_attempt`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, update

from corral.protocol import StopWhy, stop_order
from corral.store import schema
from corral.store.engine import dumps

if TYPE_CHECKING:  # the scheduler process, which imports this module, needs no API context
    from corral.server.context import Context

LIVE = ("starting", "running")
Journal = Callable[[Connection, list[dict[str, Any]]], object]


@dataclass(frozen=True)
class Stop:
    """One attempt to stop by the checkpoint contract: the signal in `signal_in` s (now when
    None), then `grace` s, then a kill at `deadline`."""

    job: str
    attempt: int
    kind: str  # the attempt's stop_kind: preempt, cancel, requeue
    by: str | None
    deadline: float
    grace: float
    why: StopWhy  # the order's `why` (docs/node-protocol.md)
    signal_in: float | None = None


def stop_attempt(conn: Connection, stop: Stop, nodes: Iterable[str], journal: Journal | None = None) -> bool:
    """Mark a live attempt and its job stopping, send each node its stop order, and (with
    `journal`) journal an `x.stop`. False, with nothing written, when the attempt is not live."""
    a, j = schema.attempts, schema.jobs
    changed = conn.execute(
        update(a)
        .where(a.c.job_id == stop.job, a.c.attempt == stop.attempt, a.c.state.in_(LIVE))
        .values(state="stopping", stop_kind=stop.kind, stop_by=stop.by, deadline=stop.deadline)
    ).rowcount
    if changed != 1:
        return False
    conn.execute(
        update(j)
        .where(j.c.id == stop.job, j.c.attempt == stop.attempt)
        .values(state="stopping", version=j.c.version + 1)
    )
    body = dumps(stop_order(stop.job, stop.attempt, stop.grace, stop.why, stop.signal_in))
    targets = sorted(set(nodes))
    if targets:
        conn.execute(schema.outbox.insert(), [{"node": node, "body": body} for node in targets])
    if journal is not None:
        entry = {"event": "x.stop", "job": stop.job, "attempt": stop.attempt, "deadline": stop.deadline}
        journal(conn, [{**entry, "kind": stop.kind}])
    return True


def nodes_of(placement: list[dict[str, Any]]) -> list[str]:
    """The distinct nodes of a placement, sorted."""
    return sorted({str(p["node"]) for p in placement})


def requeue_attempt(
    ctx: Context,
    conn: Connection,
    job: str,
    attempt: int,
    placement: list[dict[str, Any]],
    grace: float,
    signal_in: float,
    by: str,
    why: StopWhy,
) -> bool:
    """Stop a live attempt by the checkpoint contract (the signal in `signal_in` s, the grace, a
    kill) and put its job back in its queue: a disruption, not a failure. False if it was not live."""
    deadline = ctx.clock() + signal_in + grace
    stop = Stop(job, attempt, "requeue", by, deadline, grace, why, signal_in)
    return stop_attempt(conn, stop, nodes_of(placement), ctx.journal)
