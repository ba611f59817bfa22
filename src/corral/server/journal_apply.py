"""The scheduler's journal, applied to its memory: one handler per kind of entry (a submission,
a cancel, hold or release, a stop, an agent's exit or checkpoint report, a node change, a new
configuration revision, a pause), each small, each saying whether memory must be reloaded from
the database instead (a change it cannot apply in place, or another scheduler's decision).
`JournalApplier` is the part of `Scheduler` that does it."""

from __future__ import annotations

import heapq
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from corral.core.model import JobId, NodeName, NodeSpec
from corral.core.state import ClusterState
from corral.server import metrics
from corral.server import scheduler_db as db
from corral.server.cluster import node_spec_of, scheduling_state
from corral.server.endings import Ending, ending_of
from corral.server.gates import Gates
from corral.server.jobs import spec_from_json
from corral.server.reasons import ReasonBook
from corral.store.engine import Engines

log = logging.getLogger("corral.scheduler")

# journal kinds only a scheduler writes: seen from another one, memory is stale
FOREIGN_DECISIONS = ("start", "preempting", "preempt", "lost", "restart", "finish", "fail", "reject")


class Entry(NamedTuple):
    """One journal entry as the scheduler applies it: its kind, its job, its JSON body (parsed on
    demand: most submissions never need theirs)."""

    kind: str
    job: JobId | None
    text: str

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(self.text)
        return out


@dataclass
class _Applying:
    """What one `_apply` gathers: the new pending jobs' specs, the exited attempts' rows, the
    endings to write, and whether a reload is already due (then a node change is not read)."""

    specs: dict[JobId, Any]
    stops: dict[tuple[str, int], Any]
    endings: list[tuple[str, int, Ending]]
    reloading: bool = False


class JournalApplier:
    """Applies journal entries to the scheduler's memory (`Scheduler` holds the fields)."""

    engines: Engines
    state: ClusterState | None
    clock: Callable[[], float]
    reasons: ReasonBook
    clean_exits: dict[tuple[str, int], set[str]]
    timers: list[float]
    revision: int
    paused: bool
    paused_by: tuple[str, float | None]
    stop: threading.Event
    gates: Gates  # array tasks beyond %N and jobs whose dependency waits (server/gates.py)
    _submitted: dict[str, Any]  # rows of the jobs `_load_pending` read last

    def _apply(self, entries: list[Any], endings: list[tuple[str, int, Ending]]) -> bool:
        """Bring memory up to date with others' writes; True when a full reload is needed. Each
        journal entry goes to the handler of its kind (`_HANDLERS`); kinds without one change
        nothing here."""
        submits = [r.job for r in entries if r.kind == "submit"]
        reports = [json.loads(r.body) for r in entries if r.kind == "x.exit"]
        applying = _Applying(
            self._load_pending(submits) if submits else {},
            self._stop_rows([(b["job"], b["attempt"]) for b in reports]) if reports else {},
            endings,
        )
        for r in entries:
            handler = _HANDLERS.get(r.kind)
            if handler is not None and handler(
                self, Entry(r.kind, JobId(r.job) if r.job else None, r.body), applying
            ):
                applying.reloading = True
        return applying.reloading

    # ---- one handler per journal kind: True when memory must be reloaded -------------------------
    def _on_submit(self, e: Entry, applying: _Applying) -> bool:
        state = self._state()
        if e.job is None or (spec := applying.specs.get(e.job)) is None:
            return False
        if spec.queue not in state.queues:  # accepted under a revision not in force
            log.error("job %s left out: its queue is not in the revision in force", e.job)
        elif self._is_new(e.job) and not self.gates.holds_back(self._submitted[e.job]):
            state.submit(spec)
            self.reasons.fresh.add(e.job)
        return False

    def _on_cancel(self, e: Entry, _applying: _Applying) -> bool:
        state = self._state()
        if e.job in state.jobs:
            state.remove_pending(e.job)
            return False
        if e.job in self.gates.parked:
            self.gates.forget(e.job)
            return False
        return e.job in state.running  # decided by another scheduler: see `_on_foreign`

    def _on_hold(self, e: Entry, _applying: _Applying) -> bool:
        state = self._state()
        if e.job in state.jobs:
            state.jobs[e.job].held = e.kind == "x.hold"
        elif e.job is not None:
            self.gates.set_held(e.job, e.kind == "x.hold")
        return False

    def _on_stop(self, e: Entry, _applying: _Applying) -> bool:
        body = e.body()
        attempt = self._state().running.get(e.job) if e.job else None
        if attempt is not None and attempt.attempt == body["attempt"] and e.job is not None:
            self._state().mark_preempting(e.job, body["deadline"], None)
        return False

    def _on_exit(self, e: Entry, applying: _Applying) -> bool:
        state, body = self._state(), e.body()
        row = applying.stops.get((body["job"], body["attempt"]))
        attempt = state.running.get(JobId(body["job"]))
        if row is None or attempt is None or attempt.attempt != body["attempt"]:
            return False
        if body.get("exit_code") == 0 and row.stop_kind is None and not body.get("why"):
            # a gang finishes when every node's workers have: one node done early is not
            # the end of the others (a non-zero exit, or a stop, ends it at once)
            nodes = {str(state.specs[n].name) for n, _ in attempt.placement}
            done = self.clean_exits.setdefault((body["job"], body["attempt"]), set())
            done.add(str(body.get("node", "")))
            if not nodes <= done:
                return False
        self.clean_exits.pop((body["job"], body["attempt"]), None)
        ending = ending_of(
            row.stop_kind,
            row.stop_by,
            body,
            row.restarts,
            row.max_restarts,
            self.clock(),
            row.launch_losses if row.state == "starting" else None,  # never reported running
        )
        applying.endings.append((body["job"], body["attempt"], ending))
        self._end_in_memory(body["job"], body["attempt"], ending)
        return False

    def _on_checkpoint(self, e: Entry, _applying: _Applying) -> bool:
        state = self._state()
        if e.job is not None and e.job in state.running:
            body = e.body()
            if state.running[e.job].attempt == body["attempt"]:
                state.record_checkpoint(e.job, float(body["at"]))
        return False

    def _on_node(self, e: Entry, applying: _Applying) -> bool:
        body = e.body()
        # without a node: many nodes changed at once (a server start marks every one unheard)
        # a node whose shape changed needs a reload; once one is due, node rows are not read
        reload = "node" not in body or (not applying.reloading and self._node_changed(body))
        if body.get("ends_attempts"):  # kept across a reload, like the other endings
            self._lose_attempts_on(str(body["node"]), str(body.get("reason", "")), applying.endings)
        return reload

    def _on_cluster(self, e: Entry, _applying: _Applying) -> bool:
        return bool(e.body().get("revision") != self.revision)

    def _on_pause(self, e: Entry, _applying: _Applying) -> bool:
        self.paused = e.kind == "x.pause"
        body = e.body()
        self.paused_by = (str(body.get("by", "")), body.get("t"))
        return False

    def _on_foreign(self, _e: Entry, _applying: _Applying) -> bool:
        # another scheduler decided (a stale one, during a failover): memory no longer matches
        # the database, and without a reload both could wait forever on GPUs that each believes
        # the other holds
        return True

    def _state(self) -> ClusterState:
        assert self.state is not None
        return self.state

    def _lose_attempts_on(self, node: str, reason: str, endings: list[tuple[str, int, Ending]]) -> None:
        """A lost node's attempts end as `lost` and are requeued (their other nodes are told to stop)."""
        state = self.state
        assert state is not None
        where = state.node_ids.get(NodeName(node))
        if where is None:
            return
        hit = [
            (job_id, attempt.attempt)
            for job_id, attempt in state.running.items()
            if any(n == where for n, _ in attempt.placement)
        ]
        for job_id, number in hit:
            ending = Ending(
                "lost", "pending", f"node {node} lost: {reason}" if reason else f"node {node} lost"
            )
            endings.append((str(job_id), number, ending))
            self._end_in_memory(str(job_id), number, ending)

    def _end_in_memory(self, job_id: str, attempt: int, ending: Ending) -> None:
        state = self.state
        assert state is not None
        ended = state.end(JobId(job_id), requeue=ending.requeues, now=self.clock())
        if ending.requeues:
            self.reasons.fresh.add(job_id)
        if ending.requeues and ending.not_before:
            ended.job.not_before = ending.not_before
            heapq.heappush(self.timers, ending.not_before)
        metrics.ENDINGS.labels(ending.event, ending.reason if ending.reason == "time_limit" else "").inc()

    def _node_changed(self, body: dict[str, Any]) -> bool:
        state = self.state
        assert state is not None
        with self.engines.reader.connect() as conn:
            row = db.node_row(conn, str(body["node"]))
        if row is None:
            return True
        name = NodeName(row["name"])
        node = state.node_ids.get(name)
        spec = node_spec_of(row)
        if node is None:
            state.add_node(spec, scheduling_state(row))
            return False
        if _shape(state.specs[node]) != _shape(spec):
            return True
        state.set_node_state(name, scheduling_state(row))
        unhealthy = {int(g) for g in json.loads(row["unhealthy"])}
        for gpu in range(state.specs[node].gpus):
            state.set_gpu_health(name, gpu, gpu not in unhealthy)
        return False

    def _is_new(self, job_id: JobId) -> bool:
        state = self._state()
        return job_id not in state.jobs and job_id not in state.running and job_id not in self.gates.parked

    def _load_pending(self, ids: list[str]) -> dict[JobId, Any]:
        with self.engines.reader.connect() as conn:
            rows = db.pending_rows(conn, ids)
        self._submitted = {r.id: r for r in rows}
        self.gates.note_submits(self.engines, rows)
        return {JobId(r.id): spec_from_json(r.spec) for r in rows}

    def _stop_rows(self, keys: list[tuple[str, int]]) -> dict[tuple[str, int], Any]:
        with self.engines.reader.connect() as conn:
            return db.stop_rows(conn, keys)


Handler = Callable[["JournalApplier", Entry, _Applying], bool]
_HANDLERS: dict[str, Handler] = {
    "submit": JournalApplier._on_submit,
    "cancel": JournalApplier._on_cancel,
    "x.hold": JournalApplier._on_hold,
    "x.release": JournalApplier._on_hold,
    "x.stop": JournalApplier._on_stop,
    "x.exit": JournalApplier._on_exit,
    "x.checkpoint": JournalApplier._on_checkpoint,
    "x.node": JournalApplier._on_node,
    "cluster": JournalApplier._on_cluster,
    "x.pause": JournalApplier._on_pause,
    "x.resume": JournalApplier._on_pause,
    **{kind: JournalApplier._on_foreign for kind in FOREIGN_DECISIONS},
}


def _shape(spec: NodeSpec) -> tuple[object, ...]:
    """What scheduling depends on (not the address or network settings)."""
    return (
        spec.gpus,
        spec.gpu_model,
        spec.gpu_memory_gib,
        spec.cpus,
        spec.memory_gib,
        sorted(spec.labels.items()),
        spec.nvlink,
    )
