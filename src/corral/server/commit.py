"""How the scheduler writes what it decided, each group guarded by the rows it depends on.

DESIGN.md 6.2: a start commits only if the job is still pending, unheld and at the attempt
the scheduler saw, and its nodes are still up; "preempt K and L for J" commits or drops as one;
and the unique index on live allocations makes a GPU given twice a database error. Never a
global version check. Each group runs in a SAVEPOINT of the scheduler's one transaction per
cycle (group commit); a group whose guard fails is dropped and reported, and the scheduler
rebuilds its memory from the database before the next cycle. Waiting jobs' reasons are never
written with the decisions: a thread of the scheduler writes them in short transactions of their
own (server/reason_writer.py), so a start order is never held back by a long backlog's reasons.

Starts and endings, the bulk of a busy cycle, are written many at once (`Batch.groups`): one
savepoint and a few executemany statements for all of them, each guard checked for every item
(row counts, the unique index). When any guard fails there, that savepoint is rolled back and
each item is written alone in its own savepoint, so only the stale ones are dropped, exactly as
if they had been written one by one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar

from sqlalchemy import Connection, bindparam, insert, select, update
from sqlalchemy.exc import IntegrityError

from corral.core.decisions import Preempt, Start
from corral.core.estimates import Estimate
from corral.core.eventshape import ending_line, placement_json, preempting_line, reject_line, start_line
from corral.protocol import StopWhy, start_order, stop_order
from corral.server.allocations import master_ports, record
from corral.server.attempts import Stop, stop_attempt
from corral.server.endings import Ending
from corral.store import schema
from corral.store.engine import append_events, dumps

MASTER_PORTS = range(29500, 30000)
CHUNK = 500  # values in one IN (...) or OR of prefixes (SQLite's limit on bound values is far above)

T = TypeVar("T")


class GuardFailed(Exception):
    """A row changed since the scheduler read it: the group is dropped."""


class Batch:
    """The writes of one scheduler step, applied in one transaction, group by group."""

    def __init__(self, conn: Connection, is_sqlite: bool, now: float) -> None:
        self.conn = conn
        self.is_sqlite = is_sqlite
        self.now = now
        self.own_seqs: list[int] = []
        self.dropped: list[str] = []
        self.touched_nodes: set[str] = set()

    def group(self, label: str, fn: Any, *args: Any) -> bool:
        """Run `fn(*args)` in a savepoint; False (and rolled back) when a guard or the unique index fails."""
        mark = len(self.own_seqs)
        try:
            with self.conn.begin_nested():
                fn(*args)
            return True
        except (GuardFailed, IntegrityError) as exc:
            del self.own_seqs[mark:]  # rolled back: those seqs will be someone else's
            self.dropped.append(f"{label}: {exc}")
            return False

    def groups(
        self, fn: Callable[[Sequence[T]], None], items: Sequence[T], label: Callable[[T], str]
    ) -> list[bool]:
        """`fn(items)` in one savepoint, every item its own group: which were written.

        `fn` raises when any item's guard fails; then each item is written alone, in its own
        savepoint, and only those whose guard fails are dropped.
        """
        if len(items) > 1:
            mark = len(self.own_seqs)
            try:
                with self.conn.begin_nested():
                    fn(items)
                return [True] * len(items)
            except (GuardFailed, IntegrityError):
                del self.own_seqs[mark:]
        return [self.group(label(item), fn, [item]) for item in items]

    def events(self, entries: Sequence[dict[str, Any]]) -> None:
        stored = append_events(self.conn, entries, self.is_sqlite)
        self.own_seqs.extend(e["seq"] for e in stored)

    def outboxes(self, orders: Sequence[tuple[str, dict[str, Any]]]) -> None:
        if orders:
            self.conn.execute(insert(schema.outbox), [{"node": n, "body": dumps(b)} for n, b in orders])
            self.touched_nodes.update(n for n, _ in orders)

    # ---- decisions ------------------------------------------------------------------------
    def starts(self, items: Sequence[StartItem]) -> None:
        """Start every item's attempt, all or none: each job still pending, unheld and at the
        attempt the scheduler saw, each node of its placement up, no GPU live twice."""
        if not items:
            return
        conn, j, now = self.conn, schema.jobs, self.now
        n = schema.nodes
        names = sorted({r.node for item in items for r in item.start.placement})
        up: dict[str, Any] = {}
        for chunk in _chunks(names):
            for row in conn.execute(
                select(n.c.name, n.c.address, n.c.network).where(n.c.name.in_(chunk), n.c.state == "up")
            ):
                up[row.name] = row
        for item in items:
            if any(r.node not in up for r in item.start.placement):
                raise GuardFailed(f"start {item.start.job}: a node of its placement is no longer up")
        for first in (True, False):  # a first attempt sets the job's start time
            rows = [
                {"b_job": i.start.job, "b_previous": i.previous_attempt, "b_attempt": i.start.attempt}
                for i in items
                if (i.previous_attempt == 0) == first
            ]
            if not rows:
                continue
            values: dict[str, Any] = {"start_time": now} if first else {}
            changed = conn.execute(
                update(j)
                .where(
                    j.c.id == bindparam("b_job"),
                    j.c.state == "pending",
                    j.c.held.is_(False),
                    j.c.attempt == bindparam("b_previous"),
                )
                .values(
                    state="starting",
                    attempt=bindparam("b_attempt"),
                    version=j.c.version + 1,
                    reason="",
                    reason_code="",
                    reason_at=None,
                    **values,
                ),
                rows,
            ).rowcount
            if changed != len(rows):
                what = f"start {rows[0]['b_job']}" if len(rows) == 1 else f"{len(rows)} starts"
                raise GuardFailed(f"{what}: a job is no longer pending at the attempt seen")
        ports = master_ports(conn, [i.start.placement[0].node for i in items if i.start.placement])
        attempts, gpus, events, orders = [], [], [], []
        for item in items:
            s = item.start
            placement = placement_json(s.placement)
            master_port = _lowest_free(ports, s.placement[0].node) if s.placement else MASTER_PORTS[0]
            attempts.append(
                {
                    "job_id": s.job,
                    "attempt": s.attempt,
                    "state": "starting",
                    "placement": dumps(placement),
                    "master_port": master_port,
                    "started_at": now,
                }
            )
            gpus += [
                {"job_id": s.job, "attempt": s.attempt, "node": r.node, "gpu": g, "live": 1}
                for r in s.placement
                for g in r.gpus
            ]
            events.append(start_line(now, s.job, s.attempt, placement, estimate_fields(item.estimate)))
            nodes = sorted({r.node for r in s.placement})
            order = start_order(
                s.job,
                s.attempt,
                placement,
                item.run_as,
                item.request,
                addresses={name: up[name].address for name in nodes},
                networks={
                    name: json.loads(up[name].network) for name in nodes if up[name].network not in ("", "{}")
                },
                master_port=master_port,
                # per attempt, on the agent's monotonic clock (DESIGN.md 6.5): seconds, not a deadline
                time_limit_s=item.time_limit,
            )
            orders += [(node, order) for node in nodes]
        conn.execute(insert(schema.attempts), attempts)
        record(conn, [(i.start.job, i.start.attempt, i.start.placement) for i in items])
        if gpus:  # a job of 0 GPUs holds none (an empty executemany would insert one empty row)
            conn.execute(insert(schema.allocations), gpus)
        self.events(events)
        self.outboxes(orders)

    def preempt(self, victims: Sequence[tuple[Preempt, list[str]]]) -> None:
        """Tell every victim of one preemptor to checkpoint and stop; all or none."""
        for p, nodes in victims:
            self._stop(p.job, p.attempt, "preempt", p.by, p.deadline, nodes)
        self.events([preempting_line(self.now, p.job, p.attempt, p.by, p.deadline) for p, _ in victims])

    def _stop(
        self, job: str, attempt: int, kind: str, by: str | None, deadline: float, nodes: list[str]
    ) -> None:
        stop = Stop(job, attempt, kind, by, deadline, max(0.0, deadline - self.now), StopWhy.PREEMPT)
        if not stop_attempt(self.conn, stop, nodes):
            raise GuardFailed(f"stop {job}: attempt {attempt} is no longer live")

    def reject(self, job: str, reason: str) -> None:
        j = schema.jobs
        changed = self.conn.execute(
            update(j)
            .where(j.c.id == job, j.c.state == "pending")
            .values(
                state="rejected",
                reason=reason,
                reason_code="never_fits",
                reason_at=None,
                end_time=self.now,
                version=j.c.version + 1,
            )
        ).rowcount
        if changed != 1:
            raise GuardFailed(f"reject {job}: no longer pending")
        self.events([reject_line(self.now, job, reason)])

    # ---- endings --------------------------------------------------------------------------
    def ends(self, items: Sequence[EndItem]) -> None:
        """Close each attempt, release its GPUs, move its job on, log the ending events; all or none."""
        if not items:
            return
        conn, a, al = self.conn, schema.attempts, schema.allocations
        keys = {(i.job, i.attempt) for i in items}
        before: dict[tuple[str, int], Any] = {}
        for chunk in _chunks(sorted({i.job for i in items})):
            for row in conn.execute(
                select(a.c.job_id, a.c.attempt, a.c.state, a.c.placement).where(a.c.job_id.in_(chunk))
            ):
                if (row.job_id, row.attempt) in keys:
                    before[(row.job_id, row.attempt)] = row
        ends = [
            {
                "b_job": i.job,
                "b_attempt": i.attempt,
                "b_kind": i.outcome.event,
                "b_exit_code": i.outcome.exit_code,
                "b_rank": i.outcome.rank,
            }
            for i in items
        ]
        changed = conn.execute(
            update(a)
            .where(
                a.c.job_id == bindparam("b_job"), a.c.attempt == bindparam("b_attempt"), a.c.state != "ended"
            )
            .values(
                state="ended",
                ended_at=self.now,
                end_kind=bindparam("b_kind"),
                exit_code=bindparam("b_exit_code"),
                rank=bindparam("b_rank"),
            ),
            ends,
        ).rowcount
        if changed != len(items) or len(before) != len(items):
            what = f"end {items[0].job}" if len(items) == 1 else f"{len(items)} endings"
            raise GuardFailed(f"{what}: an attempt already ended")
        orders: list[tuple[str, dict[str, Any]]] = []
        for i in items:
            row = before[(i.job, i.attempt)]
            nodes = sorted({p["node"] for p in json.loads(row.placement)})
            if row.state != "stopping" and len(nodes) > 1:
                # one node's workers exited and the gang is over: the other nodes' workers may still
                # run on GPUs released here, so every node is told to kill what is left (before any
                # new start)
                # why: `corral.job.stop_reason()` on the other nodes
                stop = stop_order(i.job, i.attempt, 0.0, StopWhy.PEER_FAILED)
                orders += [(node, stop) for node in nodes]
        self.outboxes(orders)
        conn.execute(
            update(al)
            .where(al.c.job_id == bindparam("b_job"), al.c.attempt == bindparam("b_attempt"), al.c.live == 1)
            .values(live=None),
            [{"b_job": i.job, "b_attempt": i.attempt} for i in items],
        )
        self._move_jobs(items)
        self.events([_ending_event(i, self.now) for i in items])

    def _move_jobs(self, items: Sequence[EndItem]) -> None:
        """Each ended attempt's job to its next state: one executemany per shape of change."""
        j = schema.jobs
        shapes: dict[tuple[bool, bool, bool, bool], list[dict[str, Any]]] = {}
        for i in items:
            o = i.outcome
            terminal, restart = o.state != "pending", o.event == "restart"
            backoff, unlaunched = bool(o.not_before), o.launch_losses is not None
            row = {"b_job": i.job, "b_attempt": i.attempt, "b_state": o.state, "b_exit_code": o.exit_code}
            if terminal:  # a terminal state: its reason is how it ended, not why it waited
                row.update(b_reason=o.reason, b_reason_code=o.event)
            if backoff:  # a restart's, or a loss before launch's
                row["b_not_before"] = o.not_before
            if unlaunched:
                row["b_launch_losses"] = o.launch_losses
            shapes.setdefault((terminal, restart, backoff, unlaunched), []).append(row)
        for (terminal, restart, backoff, unlaunched), rows in shapes.items():
            values: dict[str, Any] = {
                "state": bindparam("b_state"),
                "version": j.c.version + 1,
                "exit_code": bindparam("b_exit_code"),
            }
            if terminal:
                values.update(
                    end_time=self.now,
                    reason=bindparam("b_reason"),
                    reason_code=bindparam("b_reason_code"),
                    reason_at=None,
                )
            if restart:
                values.update(restarts=j.c.restarts + 1)
            if backoff:
                values.update(not_before=bindparam("b_not_before"))
            if unlaunched:
                values.update(launch_losses=bindparam("b_launch_losses"))
            self.conn.execute(
                update(j)
                .where(j.c.id == bindparam("b_job"), j.c.attempt == bindparam("b_attempt"))
                .values(**values),
                rows,
            )


class StartItem(NamedTuple):
    """One start to write: the decision, the attempt the job was at, what its agents are sent."""

    start: Start
    previous_attempt: int
    request: dict[str, Any]
    run_as: str
    time_limit: float | None = None
    estimate: Estimate | None = None  # the job's run time from history when queued (`PendingJob.estimate`)


def estimate_fields(estimate: Estimate | None) -> dict[str, Any] | None:
    """The `start` event's fields of its own (DESIGN.md 4.6 allows them): the run time history
    estimated for the job when it was queued, in all (seconds, not remaining), the number of past
    jobs it drew on and what they were (`corral.core.estimates`); none without an estimate."""
    if estimate is None:
        return None
    return {
        "estimate": round(estimate.seconds, 3),
        "estimate_drawn_on": estimate.drawn_on,
        "estimate_basis": estimate.basis,
    }


class EndItem(NamedTuple):
    job: str
    attempt: int
    outcome: Ending


def _ending_event(i: EndItem, now: float) -> dict[str, Any]:
    o = i.outcome
    return ending_line(o.event, now, i.job, i.attempt, o.reason, o.exit_code, o.rank, o.log_tail)


def _chunks(values: Sequence[T]) -> list[Sequence[T]]:
    return [values[k : k + CHUNK] for k in range(0, len(values), CHUNK)]


def _lowest_free(taken: dict[str, set[int]], node: str) -> int:
    """The lowest master port not held on `node`, now held (DESIGN.md 4.3)."""
    held = taken.setdefault(node, set())
    for port in MASTER_PORTS:
        if port not in held:
            held.add(port)
            return port
    raise GuardFailed(f"no free master port on {node}")
