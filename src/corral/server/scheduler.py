"""The scheduler process: the single writer of placements (DESIGN.md 1 and 6.2).

It keeps the scheduling state in memory (built from the database at start), tails the journal
(`events`, public and `x.` kinds) for what others wrote (submissions, cancels, holds, agent
reports, node and configuration changes), runs `corral.core.cycle.schedule` when something
changed, and commits the cycle's decisions in guarded groups in one transaction. It sleeps on
a doorbell (a UDP datagram the API sends after each commit), not on a fixed poll, or until the
last cycle's `next_wake` (the core's earliest time at which an input of its decisions changes
by itself: a backoff or a victim's min_runtime ends, a reservation begins) or a restart
backoff's end; a slow fallback re-reads the journal in case a ring was lost. When a group's
guard fails (another writer got there first) the group is dropped and the memory rebuilt
from the database, so a second or stale scheduler can never allocate a GPU twice or start a
job twice. While an admin has paused scheduling, every pending job's reason says so.
"""

from __future__ import annotations

import heapq
import json
import logging
import math
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from sqlalchemy import select

from corral.core import reasons as why_text
from corral.core.cycle import schedule
from corral.core.decisions import CycleResult, Preempt
from corral.core.model import JobId, NodeName, NodeSpec
from corral.core.state import ClusterState
from corral.policies.registry import load_policy
from corral.server import metrics
from corral.server.cluster import get_setting, node_spec_of, scheduling_state
from corral.server.commit import Batch, EndItem, StartItem
from corral.server.doorbell import Bell, Doorbell
from corral.server.endings import Ending, ending_of
from corral.server.gates import Gates
from corral.server.in_force import NoRevisionApplies, choose, report_refusal
from corral.server.jobs import spec_from_json
from corral.server.reasons import ReasonBook, ReasonChange
from corral.server.restore import unapplied_exits
from corral.store import schema
from corral.store.engine import Engines

log = logging.getLogger("corral.scheduler")

FALLBACK_WAKE = 2.0  # seconds: re-read the journal even without a ring
JOURNAL_PAGE = 5000
# kinds only a scheduler writes: one that is not this scheduler's own came from another
FOREIGN_DECISIONS = ("start", "preempting", "preempt", "lost", "restart", "finish", "fail", "reject")
# Under a flood of changes, cycles are gathered: the next starts no sooner than MIN_CYCLE_INTERVAL
# after the last one began, nor sooner than CYCLE_DUTY times the last step (cycle and writes)
# took after it ended, but a change waits at most MAX_CYCLE_PAUSE for that: a backlog of short
# steps costs the scheduler at most half a core (the API keeps the rest and SQLite's write lock
# between steps), and an exit or a submission reaches a cycle within MAX_CYCLE_PAUSE plus the
# step under way. An idle cluster's cycle takes well under a millisecond.
MIN_CYCLE_INTERVAL = 0.02
CYCLE_DUTY = 1.0
MAX_CYCLE_PAUSE = 0.25
REASON_FLUSH = 1.0  # seconds between writes of reasons alone (decisions write them at once)


class Scheduler:
    def __init__(
        self, engines: Engines, policy: str = "default", clock: Callable[[], float] = time.time
    ) -> None:
        self.engines = engines
        self.clock = clock  # scheduling time (Unix time; tests and scenarios inject a virtual one)
        self.profile = load_policy(policy)
        self.policy = policy
        self.doorbell = Doorbell("scheduler")
        self.api_bell = Bell("api", engines.reader)
        self.stop = threading.Event()
        self.state: ClusterState | None = None
        self.last_seq = 0
        self.own: set[int] = set()
        # nodes whose workers all exited 0, per live multi-node attempt: it finishes with the last
        self.clean_exits: dict[tuple[str, int], set[str]] = {}
        self.lost_nodes: list[tuple[str, str]] = []  # (node, reason) whose attempts are still to end
        self.paused = False
        self.paused_by: tuple[str, float | None] = ("", None)  # who paused scheduling, and when
        self.timers: list[float] = []
        self.wake = math.inf  # the last cycle's `next_wake`
        self.reasons = ReasonBook()
        self.cycles = 0
        self.replay: list[Any] = []  # journal entries behind the cursor still to apply (after a reload)
        self.revision = -1
        self.next_cycle = 0.0
        self.reasons_due = 0.0
        self.reason_flush = REASON_FLUSH
        self.reasons_waiting = False  # a cycle's reasons were not written yet
        self.gates = Gates()  # array tasks beyond %N and jobs whose dependency waits (server/gates.py)
        self._submitted: dict[str, Any] = {}  # rows of the jobs `_load_pending` read last

    # ---- memory from the database -------------------------------------------------------
    def reload(self) -> None:
        """Rebuild the in-memory state from one consistent read of the database."""
        started = time.perf_counter()
        conn = self.engines.reader.connect()
        if not self.engines.is_sqlite:
            conn = conn.execution_options(isolation_level="REPEATABLE READ")
        j, a = schema.jobs, schema.attempts
        with conn, conn.begin():
            self.last_seq = (
                conn.execute(
                    select(schema.events.c.seq).order_by(schema.events.c.seq.desc()).limit(1)
                ).scalar()
                or 0
            )
            live = conn.execute(
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
            pending = conn.execute(
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
                )
                .where(j.c.state == "pending")
                .order_by(j.c.seq)
            ).all()
            pending = self.gates.load(conn, list(pending))
            specs = [(spec_from_json(r.spec), r) for r in pending]
            found = choose(conn, live, specs, self.policy, self.revision)
            model, state = found.model, found.state
            self.revision, self.profile = model.revision, found.profile
            self.paused = get_setting(conn, "scheduler.paused", "0") == "1"
            if self.paused:
                self.paused_by = _last_pause(conn)
            self.replay = unapplied_exits(conn)  # refills clean_exits as they are applied again
            self.clean_exits.clear()
            n = schema.nodes
            self.lost_nodes = [
                (r.name, r.reason)
                for r in conn.execute(select(n.c.name, n.c.reason).where(n.c.state == "lost")).all()
                if not r.reason.startswith("unclean")  # an unclean node's live attempts are real
            ]
            for job, row in found.submitted:
                job.held, job.not_before = bool(row.held), row.not_before
                if row.reason_code:  # as persisted: a restart does not rewrite every pending job's reason
                    self.reasons.known.setdefault(job.spec.id, (row.reason_code, row.reason, row.reason_at))
                if row.not_before > self.clock():
                    heapq.heappush(self.timers, row.not_before)
        state.plan.commit()
        self.state = state
        self.reasons.look_at_all()
        self.own.clear()
        if found.refused is not None:
            with self.engines.writer.begin() as conn:
                self.own.update(report_refusal(conn, found.refused, model.revision, self.engines.is_sqlite))
        if found.left_out:
            log.error(
                "pending jobs left out (their queue is in no applicable revision): %s",
                ", ".join(found.left_out[:20]),
            )
        log.info(
            "state loaded in %.0f ms: %d nodes, %d pending, %d live attempts (journal at %d)",
            (time.perf_counter() - started) * 1000,
            len(state.specs),
            len(state.jobs),
            len(state.running),
            self.last_seq,
        )

    # ---- the loop -----------------------------------------------------------------------
    def run(self) -> None:
        self.doorbell.publish(self.engines.writer)
        self.reload_until_applicable()
        self.step(force=True)
        while not self.stop.is_set():
            now = self.clock()
            while self.timers and self.timers[0] <= now:
                heapq.heappop(self.timers)
            timeout = FALLBACK_WAKE if not self.timers else min(FALLBACK_WAKE, self.timers[0] - now)
            timeout = max(0.0, min(timeout, self.wake - now))
            if self.reasons_waiting:
                timeout = min(timeout, self.reasons_due - time.monotonic())
            rung = self.doorbell.wait(timeout)
            pause = self.next_cycle - time.monotonic()
            if rung and pause > 0:  # a flood of rings: gather it into one cycle
                time.sleep(pause)
            due = (bool(self.timers) and self.timers[0] <= self.clock()) or self.wake <= self.clock()
            due = due or (self.reasons_waiting and time.monotonic() >= self.reasons_due)
            try:
                self.step(force=rung or due)
            except NoRevisionApplies:
                self.reload_until_applicable()

    def reload_until_applicable(self) -> None:
        """Reload; while no stored revision can hold the live work, say so and wait for a new one
        (never exit: a supervisor would restart into the same state, over and over)."""
        while not self.stop.is_set():
            try:
                self.reload()
                return
            except NoRevisionApplies as exc:
                metrics.CONFIG_REFUSED.inc()
                log.error("%s; waiting for a new configuration revision", exc)
                self.doorbell.wait(FALLBACK_WAKE * 5)

    def step(self, force: bool = False) -> None:
        """Read the journal, apply it, run a cycle if anything changed, commit the decisions."""
        assert self.state is not None
        entries, self.replay = self.replay + self._read_journal(), []
        endings: list[tuple[str, int, Ending]] = []
        reload = self._apply(entries, endings)
        for node, reason in self.lost_nodes:  # lost before a restart, attempts not yet ended
            self._lose_attempts_on(node, reason, endings)
        self.lost_nodes = []
        if reload:
            self.reload()
            endings = [e for e in endings if e[0] in self.state.running]
            for job_id, attempt, ending in endings:
                self._end_in_memory(job_id, attempt, ending)
        force = self._open_gates(bool(entries or endings)) or force
        if not entries and not force:
            return
        now = self.clock()
        result = None
        began = time.monotonic()
        self.wake = math.inf
        if self.paused and self.state.jobs:  # no decisions: every pending job says why
            result = CycleResult(now, others=why_text.paused(*self.paused_by))
        elif self.state.jobs:
            result = schedule(self.state, self.profile, now)
            self.wake = result.next_wake
            took = time.monotonic() - began
            self.next_cycle = _next_cycle(began, took)
            metrics.CYCLE_SECONDS.observe(took)
            self.cycles += 1
        changes: list[ReasonChange] = []
        decided = endings or (result is not None and _decided(result))
        if result is not None:
            # reasons alone are written at most every REASON_FLUSH seconds: under a flood of
            # submissions each write would take SQLite's one write lock from the API
            self.reasons_waiting = not (decided or time.monotonic() >= self.reasons_due)
            if not self.reasons_waiting:
                changes = self.reasons.changes(self.state, result)
                self.reasons_due = time.monotonic() + self.reason_flush
        else:
            self.reasons_waiting = False
        if not endings and not changes and (result is None or not _decided(result)):
            return
        batch = self._commit(endings, result, changes, now)
        self.own.update(batch.own_seqs)
        if self.gates.waiting and (endings or (result is not None and _decided(result))):
            self.gates.recheck = True  # what just ended or started may let a dependent job in
            self.wake = min(self.wake, now)
        if batch.dropped:
            log.warning(
                "dropped %d decision groups (%s); rebuilding state", len(batch.dropped), batch.dropped[0]
            )
            self.reload()
        self.api_bell.ring()
        if result is not None:  # the writes count toward the cycle's duty too
            self.next_cycle = max(self.next_cycle, _next_cycle(began, time.monotonic() - began))

    def _is_new(self, job_id: JobId) -> bool:
        state = self.state
        assert state is not None
        return job_id not in state.jobs and job_id not in state.running and job_id not in self.gates.parked

    def _open_gates(self, changed: bool) -> bool:
        """Let gated jobs into the core (server/gates.py); True when it let any in or cancelled any."""
        assert self.state is not None
        self.gates.recheck = self.gates.recheck or changed
        released, seqs = self.gates.open(self.state, self.engines, self.clock())
        self.own.update(seqs)
        self.reasons.fresh.update(released)
        if seqs:
            self.api_bell.ring()
        return bool(released or seqs)

    def _read_journal(self) -> list[Any]:
        e = schema.events
        with self.engines.reader.connect() as conn:
            rows = conn.execute(
                select(e.c.seq, e.c.kind, e.c.job, e.c.body)
                .where(e.c.seq > self.last_seq)
                .order_by(e.c.seq)
                .limit(JOURNAL_PAGE)
            ).all()
        if rows:
            self.last_seq = rows[-1].seq
        out = [r for r in rows if r.seq not in self.own]
        self.own.difference_update(r.seq for r in rows)
        return out

    def _apply(self, entries: list[Any], endings: list[tuple[str, int, Ending]]) -> bool:
        """Bring memory up to date with others' writes; True when a full reload is needed."""
        state = self.state
        assert state is not None
        submits = [r.job for r in entries if r.kind == "submit"]
        specs = self._load_pending(submits) if submits else {}
        reports = [json.loads(r.body) for r in entries if r.kind == "x.exit"]
        stops = self._stop_rows([(b["job"], b["attempt"]) for b in reports]) if reports else {}
        reload = False
        for r in entries:
            kind, job_id = r.kind, JobId(r.job) if r.job else None
            if kind == "submit" and job_id in specs:
                if specs[job_id].queue not in state.queues:  # accepted under a revision not in force
                    log.error("job %s left out: its queue is not in the revision in force", job_id)
                elif self._is_new(job_id) and not self.gates.holds_back(self._submitted[job_id]):
                    state.submit(specs[job_id])
                    self.reasons.fresh.add(job_id)
            elif kind == "cancel" and job_id in state.jobs:
                state.remove_pending(job_id)
            elif kind == "cancel" and job_id in self.gates.parked:
                self.gates.forget(job_id)
            elif kind in ("x.hold", "x.release") and job_id in state.jobs:
                state.jobs[job_id].held = kind == "x.hold"
            elif kind in ("x.hold", "x.release") and job_id is not None:
                self.gates.set_held(job_id, kind == "x.hold")
            elif kind == "x.stop":
                body = json.loads(r.body)
                attempt = state.running.get(job_id) if job_id else None
                if attempt is not None and attempt.attempt == body["attempt"] and job_id is not None:
                    state.mark_preempting(job_id, body["deadline"], None)
            elif kind == "x.exit":
                body = json.loads(r.body)
                row = stops.get((body["job"], body["attempt"]))
                attempt = state.running.get(JobId(body["job"]))
                if row is None or attempt is None or attempt.attempt != body["attempt"]:
                    continue
                if body.get("exit_code") == 0 and row.stop_kind is None and not body.get("why"):
                    # a gang finishes when every node's workers have: one node done early is not
                    # the end of the others (a non-zero exit, or a stop, ends it at once)
                    nodes = {str(state.specs[n].name) for n, _ in attempt.placement}
                    done = self.clean_exits.setdefault((body["job"], body["attempt"]), set())
                    done.add(str(body.get("node", "")))
                    if not nodes <= done:
                        continue
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
                endings.append((body["job"], body["attempt"], ending))
                self._end_in_memory(body["job"], body["attempt"], ending)
            elif kind == "x.checkpoint" and job_id in state.running:
                body = json.loads(r.body)
                if job_id is not None and state.running[job_id].attempt == body["attempt"]:
                    state.record_checkpoint(job_id, float(body["at"]))
            elif kind == "x.node":
                body = json.loads(r.body)
                # without a node: many nodes changed at once (a server start marks every one unheard)
                reload = reload or "node" not in body or self._node_changed(body)
                if body.get("ends_attempts"):  # kept across a reload, like the other endings
                    self._lose_attempts_on(str(body["node"]), str(body.get("reason", "")), endings)
            elif kind == "cluster":
                reload = reload or json.loads(r.body).get("revision") != self.revision
            elif kind in ("x.pause", "x.resume"):
                self.paused = kind == "x.pause"
                body = json.loads(r.body)
                self.paused_by = (str(body.get("by", "")), body.get("t"))
            elif kind in FOREIGN_DECISIONS or (kind == "cancel" and job_id in state.running):
                # another scheduler decided (a stale one, during a failover): memory no longer
                # matches the database, and without a reload both could wait forever on GPUs
                # that each believes the other holds
                reload = True
        return reload

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
            row = (
                conn.execute(select(schema.nodes).where(schema.nodes.c.name == body["node"]))
                .mappings()
                .first()
            )
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

    def _load_pending(self, ids: list[str]) -> dict[JobId, Any]:
        j = schema.jobs
        with self.engines.reader.connect() as conn:
            rows = conn.execute(
                select(
                    j.c.id, j.c.spec, j.c.attempt, j.c.held, j.c.not_before, j.c.reason, j.c.array_id,
                    j.c.dependency,
                ).where(j.c.id.in_(ids), j.c.state == "pending")
            ).all()  # fmt: skip
        self._submitted = {r.id: r for r in rows}
        self.gates.note_submits(self.engines, rows)
        return {JobId(r.id): spec_from_json(r.spec) for r in rows}

    def _stop_rows(self, keys: list[tuple[str, int]]) -> dict[tuple[str, int], Any]:
        a, j = schema.attempts, schema.jobs
        with self.engines.reader.connect() as conn:
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
        out: dict[tuple[str, int], Any] = {}
        for row in rows:
            r = _Row(row._asdict())
            r.max_restarts = json.loads(r.request).get("max_restarts", 3)
            out[(r.job_id, r.attempt)] = r
        return out

    # ---- writing decisions --------------------------------------------------------------
    def _commit(
        self,
        endings: list[tuple[str, int, Ending]],
        result: CycleResult | None,
        changes: list[ReasonChange],
        now: float,
    ) -> Batch:
        state = self.state
        assert state is not None
        with self.engines.writer.begin() as conn:
            batch = Batch(conn, self.engines.is_sqlite, now)
            ends = [EndItem(job_id, attempt, ending) for job_id, attempt, ending in endings]
            batch.groups(batch.ends, ends, lambda e: f"end {e.job}")
            if result is not None:
                self._decisions(batch, result)
            batch.reasons(changes)
        return batch

    def _decisions(self, batch: Batch, result: CycleResult) -> None:
        state = self.state
        assert state is not None
        for r in result.rejections:
            batch.group(f"reject {r.job}", batch.reject, r.job, r.reason)
        by: dict[str, list[tuple[Preempt, list[str]]]] = defaultdict(list)
        for p in result.preemptions:
            placement = state.running[p.job].placement
            names = sorted({str(state.specs[n].name) for n, _ in placement})
            by[p.by].append((p, names))
        for preemptor, victims in by.items():
            if batch.group(f"preempt for {preemptor}", batch.preempt, victims):
                metrics.PREEMPTIONS.labels("preempt").inc(len(victims))
        if result.starts:
            extra = self._start_extras([s.job for s in result.starts])
            items = []
            for s in result.starts:
                request, run_as, _ = extra[s.job]
                running = state.running.get(s.job)
                limit = running.job.spec.time_limit if running is not None else None
                items.append(StartItem(s, s.attempt - 1, request, run_as, limit))
            written = batch.groups(batch.starts, items, lambda i: f"start {i.start.job}")
            for item, ok in zip(items, written, strict=True):
                if ok:
                    metrics.ADMISSION_WAIT.observe(max(0.0, batch.now - extra[item.start.job][2]))

    def _start_extras(self, ids: list[str]) -> dict[str, tuple[dict[str, Any], str, float]]:
        j = schema.jobs
        with self.engines.reader.connect() as conn:
            rows = conn.execute(
                select(j.c.id, j.c.request, j.c.run_as, j.c.submit_time).where(j.c.id.in_(ids))
            ).all()
        return {r.id: (json.loads(r.request), r.run_as, r.submit_time) for r in rows}


class _Row(dict[str, Any]):
    def __getattr__(self, name: str) -> Any:
        return self[name]

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value


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


def _last_pause(conn: Any) -> tuple[str, float | None]:
    """Who paused scheduling, and when (from the newest `x.pause` of the journal)."""
    e = schema.events
    body = conn.execute(
        select(e.c.body).where(e.c.kind == "x.pause").order_by(e.c.seq.desc()).limit(1)
    ).scalar()
    if body is None:
        return ("", None)
    entry = json.loads(body)
    return (str(entry.get("by", "")), entry.get("t"))


def _next_cycle(began: float, took: float) -> float:
    """When the next cycle may start, after a step that began at `began` and took `took` s."""
    return began + max(MIN_CYCLE_INTERVAL, took + min(took * CYCLE_DUTY, MAX_CYCLE_PAUSE))


def _decided(result: CycleResult) -> bool:
    return bool(result.starts or result.preemptions or result.rejections)


def main(url: str, policy: str = "default") -> None:
    """Entry point of `corral scheduler` (the server starts it as its own process)."""
    from corral.store.engine import make_engines

    logging.basicConfig(level=logging.INFO, format="%(asctime)s scheduler %(levelname)s %(message)s")
    engines = make_engines(url)
    Scheduler(engines, policy).run()
