"""How the scheduler writes what it decided, each group guarded by the rows it depends on.

DESIGN.md 6.2: a start commits only if the job is still pending, unheld and at the attempt
the scheduler saw, and its nodes are still up; "preempt K and L for J" commits or drops as one;
and the unique index on live allocations makes a GPU given twice a database error. Never a
global version check. Each group runs in a SAVEPOINT of the scheduler's one transaction per
cycle (group commit); a group whose guard fails is dropped and reported, and the scheduler
rebuilds its memory from the database before the next cycle.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, and_, bindparam, insert, select, update
from sqlalchemy.exc import IntegrityError

from corral.core.decisions import Preempt, Start
from corral.core.eventshape import placement_json
from corral.store import schema
from corral.store.engine import append_events, dumps

RESTART_BACKOFF = 10.0
RESTART_BACKOFF_MAX = 300.0
MASTER_PORTS = range(29500, 30000)


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
        try:
            with self.conn.begin_nested():
                fn(*args)
            return True
        except (GuardFailed, IntegrityError) as exc:
            self.dropped.append(f"{label}: {exc}")
            return False

    def events(self, entries: Sequence[dict[str, Any]]) -> None:
        stored = append_events(self.conn, entries, self.is_sqlite)
        self.own_seqs.extend(e["seq"] for e in stored)

    def outbox(self, node: str, body: dict[str, Any]) -> None:
        self.conn.execute(insert(schema.outbox).values(node=node, body=dumps(body)))
        self.touched_nodes.add(node)

    # ---- decisions ------------------------------------------------------------------------
    def start(
        self,
        s: Start,
        previous_attempt: int,
        request: dict[str, Any],
        run_as: str,
        time_limit: float | None = None,
    ) -> None:
        conn, j = self.conn, schema.jobs
        nodes = sorted({r.node for r in s.placement})
        up = conn.execute(
            select(schema.nodes.c.name, schema.nodes.c.address, schema.nodes.c.network).where(
                schema.nodes.c.name.in_(nodes), schema.nodes.c.state == "up"
            )
        ).all()
        if len(up) != len(nodes):
            raise GuardFailed(f"start {s.job}: a node of its placement is no longer up")
        changed = conn.execute(
            update(j)
            .where(
                j.c.id == s.job, j.c.state == "pending", j.c.held.is_(False), j.c.attempt == previous_attempt
            )
            .values(
                state="starting",
                attempt=s.attempt,
                version=j.c.version + 1,
                reason="",
                reason_code="",
                start_time=self.now if previous_attempt == 0 else j.c.start_time,
            )
        ).rowcount
        if changed != 1:
            raise GuardFailed(f"start {s.job}: the job is no longer pending at attempt {previous_attempt}")
        placement = placement_json(s.placement)
        master_port = self._master_port(s.placement[0].node) if s.placement else MASTER_PORTS[0]
        conn.execute(
            insert(schema.attempts).values(
                job_id=s.job,
                attempt=s.attempt,
                state="starting",
                placement=dumps(placement),
                master_port=master_port,
                started_at=self.now,
            )
        )
        gpus = [
            {"job_id": s.job, "attempt": s.attempt, "node": r.node, "gpu": g, "live": 1}
            for r in s.placement
            for g in r.gpus
        ]
        if gpus:  # a job of 0 GPUs holds none (an empty executemany would insert one empty row)
            conn.execute(insert(schema.allocations), gpus)
        self.events(
            [{"event": "start", "t": self.now, "job": s.job, "attempt": s.attempt, "placement": placement}]
        )
        order = {
            "job": s.job,
            "attempt": s.attempt,
            "placement": placement,
            "run_as": run_as,
            "spec": request,
            "addresses": {r.name: r.address for r in up},
            "networks": {r.name: json.loads(r.network or "{}") for r in up if r.network not in ("", "{}")},
            "master_port": master_port,
            # per attempt, on the agent's monotonic clock (DESIGN.md 6.5): seconds, not a deadline
            "time_limit_s": time_limit,
        }
        for node in nodes:
            self.outbox(node, {"kind": "start", **order})

    def _master_port(self, node: str) -> int:
        """DESIGN.md 4.3: the lowest port of the range no live attempt with replica 0 on `node` holds."""
        a = schema.attempts
        prefix = '[{"node":' + json.dumps(node) + ","
        taken = set(
            self.conn.execute(
                select(a.c.master_port).where(
                    a.c.state != "ended",
                    a.c.master_port.is_not(None),
                    a.c.placement.startswith(prefix, autoescape=True),
                )
            ).scalars()
        )
        for port in MASTER_PORTS:
            if port not in taken:
                return port
        raise GuardFailed(f"no free master port on {node}")

    def preempt(self, victims: Sequence[tuple[Preempt, list[str]]]) -> None:
        """Tell every victim of one preemptor to checkpoint and stop; all or none."""
        for p, nodes in victims:
            self._stop(p.job, p.attempt, "preempt", p.by, p.deadline, nodes)
        self.events(
            [
                {
                    "event": "preempting",
                    "t": self.now,
                    "job": p.job,
                    "attempt": p.attempt,
                    "by": p.by,
                    "deadline": p.deadline,
                }
                for p, _ in victims
            ]
        )

    def _stop(
        self, job: str, attempt: int, kind: str, by: str | None, deadline: float, nodes: list[str]
    ) -> None:
        a, j = schema.attempts, schema.jobs
        changed = self.conn.execute(
            update(a)
            .where(a.c.job_id == job, a.c.attempt == attempt, a.c.state.in_(("starting", "running")))
            .values(state="stopping", stop_kind=kind, stop_by=by, deadline=deadline)
        ).rowcount
        if changed != 1:
            raise GuardFailed(f"stop {job}: attempt {attempt} is no longer live")
        self.conn.execute(
            update(j)
            .where(j.c.id == job, j.c.attempt == attempt)
            .values(state="stopping", version=j.c.version + 1)
        )
        for node in nodes:
            self.outbox(
                node, {"kind": "stop", "job": job, "attempt": attempt, "grace": max(0.0, deadline - self.now)}
            )

    def reject(self, job: str, reason: str) -> None:
        j = schema.jobs
        changed = self.conn.execute(
            update(j)
            .where(j.c.id == job, j.c.state == "pending")
            .values(
                state="rejected",
                reason=reason,
                reason_code="never_fits",
                end_time=self.now,
                version=j.c.version + 1,
            )
        ).rowcount
        if changed != 1:
            raise GuardFailed(f"reject {job}: no longer pending")
        self.events([{"event": "reject", "t": self.now, "job": job, "reason": reason}])

    def reasons(self, changes: Sequence[tuple[str, str, str, bool]]) -> None:
        """Persist changed reasons of pending jobs; a new code also goes to the reason history."""
        if not changes:
            return
        j = schema.jobs
        self.conn.execute(
            update(j)
            .where(j.c.id == bindparam("job_id"), j.c.state == "pending")
            .values(reason_code=bindparam("code"), reason=bindparam("message")),
            [{"job_id": job, "code": code, "message": message} for job, code, message, _ in changes],
        )
        history = [
            {"job_id": job, "t": self.now, "code": code, "message": message}
            for job, code, message, new in changes
            if new
        ]
        if history:
            self.conn.execute(insert(schema.reasons), history)

    # ---- endings --------------------------------------------------------------------------
    def end(self, job: str, attempt: int, outcome: Ending) -> None:
        """Close an attempt, release its GPUs, move the job on, and log the ending event."""
        a, j, al = schema.attempts, schema.jobs, schema.allocations
        before = self.conn.execute(
            select(a.c.state, a.c.placement).where(a.c.job_id == job, a.c.attempt == attempt)
        ).first()
        changed = self.conn.execute(
            update(a)
            .where(a.c.job_id == job, a.c.attempt == attempt, a.c.state != "ended")
            .values(
                state="ended",
                ended_at=self.now,
                end_kind=outcome.event,
                exit_code=outcome.exit_code,
                rank=outcome.rank,
            )
        ).rowcount
        if changed != 1 or before is None:
            raise GuardFailed(f"end {job}: attempt {attempt} already ended")
        nodes = sorted({p["node"] for p in json.loads(before.placement)})
        if before.state != "stopping" and len(nodes) > 1:
            # one node's workers exited and the gang is over: the other nodes' workers may still run
            # on GPUs released here, so every node is told to kill what is left (before any new start)
            for node in nodes:
                self.outbox(
                    node, {"kind": "stop", "job": job, "attempt": attempt, "grace": 0.0, "why": outcome.event}
                )
        self.conn.execute(
            update(al)
            .where(and_(al.c.job_id == job, al.c.attempt == attempt, al.c.live == 1))
            .values(live=None)
        )
        values: dict[str, Any] = {
            "state": outcome.state,
            "version": j.c.version + 1,
            "exit_code": outcome.exit_code,
        }
        if outcome.state != "pending":  # a terminal state: its reason is how it ended, not why it waited
            values.update(end_time=self.now, reason=outcome.reason, reason_code=outcome.event)
        if outcome.event == "restart":
            values["restarts"] = j.c.restarts + 1
            values["not_before"] = outcome.not_before
        self.conn.execute(update(j).where(j.c.id == job, j.c.attempt == attempt).values(**values))
        event: dict[str, Any] = {"event": outcome.event, "t": self.now, "job": job, "attempt": attempt}
        if outcome.reason:
            event["reason"] = outcome.reason
        if outcome.exit_code is not None:
            event["exit_code"] = outcome.exit_code
        if outcome.rank is not None:
            event["rank"] = outcome.rank
        if outcome.log_tail:
            event["log_tail"] = outcome.log_tail
        self.events([event])


class Ending:
    """What an attempt's end means for its job: the event, the job's next state, the backoff."""

    __slots__ = ("event", "exit_code", "log_tail", "not_before", "rank", "reason", "state")

    def __init__(
        self,
        event: str,
        state: str,
        reason: str = "",
        exit_code: int | None = None,
        rank: int | None = None,
        not_before: float = 0.0,
        log_tail: str = "",
    ) -> None:
        self.event, self.state, self.reason = event, state, reason
        self.exit_code, self.rank, self.not_before = exit_code, rank, not_before
        self.log_tail = log_tail

    @property
    def requeues(self) -> bool:
        return self.state == "pending"


def ending_of(
    stop_kind: str | None,
    stop_by: str | None,
    report: dict[str, Any],
    restarts: int,
    max_restarts: int,
    now: float | None = None,
) -> Ending:
    """DESIGN.md 4.4 and 5: an exit after a stop order never counts against `max_restarts`.

    `report` is the agent's `exited` report: `exit_code`, `rank`, and where the agent knows more,
    `why` (`time_limit`: it enforced the job's limit; `setup`: the attempt could not be set up on
    the node, a mount source or the user missing, which no restart can fix; `launch`: a rank did
    not start), `message`, and `log_tail` (the last lines of the failing rank's log).
    """
    now = time.time() if now is None else now
    exit_code, rank = report.get("exit_code"), report.get("rank")
    why, message = report.get("why") or "", report.get("message") or ""
    tail = report.get("log_tail") or ""
    if stop_kind == "preempt":
        return Ending(
            "preempt", "pending", f"preempted by {stop_by}" if stop_by else "preempted", exit_code, rank
        )
    if stop_kind == "requeue":
        return Ending("preempt", "pending", f"requeued by {stop_by or 'an operator'}", exit_code, rank)
    if stop_kind == "cancel":
        return Ending("cancel", "cancelled", f"cancelled by {stop_by or 'a user'}", exit_code, rank)
    if stop_kind == "time_limit" or why == "time_limit":
        return Ending("fail", "failed", "time_limit", exit_code, rank, log_tail=tail)
    if why == "lost":  # the node came back without the workers: a disruption, not a failure
        return Ending("lost", "pending", message or "node lost", exit_code, rank)
    if why == "setup":
        return Ending("fail", "failed", message or "the attempt could not be set up", exit_code, rank)
    if exit_code == 0:
        return Ending("finish", "finished", "", 0, None)
    what = message or f"worker exited with {exit_code}"
    if restarts < max_restarts:
        backoff = min(RESTART_BACKOFF * 2**restarts, RESTART_BACKOFF_MAX)
        return Ending("restart", "pending", what, exit_code, rank, now + backoff, log_tail=tail)
    return Ending("fail", "failed", f"{what}; no restarts left", exit_code, rank, log_tail=tail)
