"""The scheduler process: the single writer of placements (DESIGN.md 1 and 6.2).

It keeps the scheduling state in memory (built from the database at start), tails the journal
(`events`, public and `x.` kinds) for what others wrote (submissions, cancels, holds, agent
reports, node and configuration changes), runs `corral.core.cycle.schedule` when something
changed, and commits the cycle's decisions in guarded groups in one transaction; waiting
jobs' reasons, soft state, are queued to a thread that writes them in short transactions of
their own (server/reasons.py says which changed, server/reason_writer.py writes them). It sleeps on
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
import logging
import math
import os
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection

from corral.core import reasons as why_text
from corral.core.cycle import schedule
from corral.core.decisions import CycleResult, Preempt
from corral.core.model import JobId
from corral.core.state import ClusterState
from corral.policies.registry import load_policy
from corral.server import metrics
from corral.server import scheduler_db as db
from corral.server.cluster import get_setting
from corral.server.commit import Batch, EndItem, StartItem
from corral.server.doorbell import bell_for, doorbell_for
from corral.server.endings import Ending
from corral.server.gates import Gates
from corral.server.in_force import NoRevisionApplies, choose, report_refusal
from corral.server.jobs import spec_from_json
from corral.server.journal_apply import JournalApplier
from corral.server.leader import Deposed, Lease
from corral.server.learned import learned
from corral.server.pacing import Pacing
from corral.server.reason_writer import ReasonWriter
from corral.server.reasons import ReasonBook
from corral.server.restore import unapplied_exits
from corral.store.engine import Engines

log = logging.getLogger("corral.scheduler")

FAULT_STOP_BEFORE_COMMIT = "CORRAL_FAULT_STOP_BEFORE_COMMIT"
FALLBACK_WAKE = 2.0  # seconds: re-read the journal even without a ring
# cycles are paced, and waiting jobs' reasons looked at now and then: `pacing.py`


class Scheduler(JournalApplier):
    def __init__(
        self,
        engines: Engines,
        policy: str = "default",
        clock: Callable[[], float] = time.time,
        lease: Lease | None = None,
    ) -> None:
        self.engines = engines
        # the leader lease (`leader.py`): every transaction that writes decisions checks it first;
        # None only where one scheduler runs by construction (tests, scenarios)
        self.lease = lease
        self.clock = clock  # scheduling time (Unix time; tests and scenarios inject a virtual one)
        self.profile = load_policy(policy)
        self.policy = policy
        self.doorbell = doorbell_for("scheduler", engines)
        self.api_bell = bell_for(["api"], engines)  # every replica's long polls, on PostgreSQL
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
        # writes the reasons the book says changed, in a thread of its own, fenced like a decision
        self.reason_writer = ReasonWriter(engines, self.fence, self.api_bell.ring)
        self.cycles = 0
        self.replay: list[Any] = []  # journal entries behind the cursor still to apply (after a reload)
        self.revision = -1
        self.pacing = Pacing()
        self.gates = Gates()  # array tasks beyond %N and jobs whose dependency waits (server/gates.py)
        self.gates.fence = self.fence
        self._submitted: dict[str, Any] = {}  # rows of the jobs `_load_pending` read last

    @property
    def reason_flush(self) -> float:
        """Seconds between looks at waiting jobs' reasons (`pacing.py`)."""
        return self.pacing.reason_flush

    @reason_flush.setter
    def reason_flush(self, seconds: float) -> None:
        self.pacing.reason_flush = seconds

    # ---- memory from the database -------------------------------------------------------
    def reload(self) -> None:
        """Rebuild the in-memory state from one consistent read of the database."""
        started = time.perf_counter()
        conn = self.engines.reader.connect()
        if not self.engines.is_sqlite:
            conn = conn.execution_options(isolation_level="REPEATABLE READ")
        with conn, conn.begin():
            self.last_seq = db.last_seq(conn)
            live = db.live_attempts(conn)
            pending = db.pending_jobs(conn)
            pending = self.gates.load(conn, list(pending))
            specs = [(spec_from_json(r.spec), r) for r in pending]
            found = choose(conn, live, specs, self.policy, self.revision, learned(conn))
            model, state = found.model, found.state
            self.revision, self.profile = model.revision, found.profile
            self.paused = get_setting(conn, "scheduler.paused", "0") == "1"
            if self.paused:
                self.paused_by = db.last_pause(conn)
            self.replay = unapplied_exits(conn)  # refills clean_exits as they are applied again
            self.clean_exits.clear()
            self.lost_nodes = db.lost_nodes(conn)
            for job, row in found.submitted:
                job.held, job.not_before = bool(row.held), row.not_before
                if row.reason_code:  # as persisted: a restart does not rewrite every pending job's reason
                    self.reasons.remember(job.spec.id, row.reason_code, row.reason, row.reason_at)
                if row.not_before > self.clock():
                    heapq.heappush(self.timers, row.not_before)
        state.plan.commit()
        self.state = state
        self.reasons.look_at_all()
        self.reason_writer.retain(state.jobs)  # a job now gated or gone keeps no queued reason
        self.own.clear()
        if found.refused is not None:
            with self.engines.writer.begin() as conn:
                self.fence(conn)
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

    def fence(self, conn: Connection) -> None:
        """First thing in every transaction that writes decisions: `Deposed` unless still the leader."""
        if self.lease is not None:
            self.lease.fence(conn)

    def leading(self) -> bool:
        return self.lease is None or self.lease.valid()

    # ---- the loop -----------------------------------------------------------------------
    def run(self) -> None:
        """Decide until stopped, or until deposed (the lease is lost: then it returns)."""
        try:
            self._run()
        except Deposed as exc:
            log.error("no longer the leader: %s", exc)
        finally:
            self.reason_writer.close()  # what it still holds is soft state: the next leader looks at all

    def _run(self) -> None:
        self.doorbell.publish(self.engines.writer)
        self.reload_until_applicable()
        self.step(force=True)
        while not self.stop.is_set():
            if not self.leading():
                raise Deposed("the leader lease was lost")
            now = self.clock()
            while self.timers and self.timers[0] <= now:
                heapq.heappop(self.timers)
            timeout = FALLBACK_WAKE if not self.timers else min(FALLBACK_WAKE, self.timers[0] - now)
            timeout = max(0.0, min(timeout, self.wake - now))
            if (reasons_in := self.pacing.reasons_wait()) is not None:
                timeout = min(timeout, reasons_in)
            rung = self.doorbell.wait(timeout)
            pause = self.pacing.pause_left()
            if rung and pause > 0:  # a flood of rings: gather it into one cycle
                time.sleep(pause)
            due = (bool(self.timers) and self.timers[0] <= self.clock()) or self.wake <= self.clock()
            due = due or self.pacing.reasons_overdue()
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
        self.reason_writer.check()  # a reasons write found the lease gone
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
            self.pacing.cycled(began, took)
            metrics.CYCLE_SECONDS.observe(took)
            self.cycles += 1
        if result is None:
            self.pacing.no_cycle()
        decided = bool(endings) or (result is not None and _decided(result))
        if decided and not self._commit_decisions(endings, result, now):
            return  # the state was rebuilt: this cycle's reasons are stale, the next looks at all
        if result is not None and self.pacing.write_reasons():
            # soft state, after the decisions (and their start orders) are committed and rung;
            # queued, the writer's thread writes them while the next cycles go on
            looked = time.monotonic()
            changes = self.reasons.changes(self.state, result)
            if changes:
                jobs = self.state.jobs
                seen = [(c, job.attempts) for c in changes if (job := jobs.get(JobId(c.job))) is not None]
                self.reason_writer.put(seen, now)
            # the duty counts the writer's time too (the look before's rows): the API's writes share the lock
            self.pacing.reasons_written(time.monotonic() - looked + self.reason_writer.take_spent())
        if result is not None:  # the writes count toward the cycle's duty too
            self.pacing.wrote(began)

    def _commit_decisions(
        self, endings: list[tuple[str, int, Ending]], result: CycleResult | None, now: float
    ) -> bool:
        """Commit the step's endings and decisions in their own transaction and ring the API;
        False when a group was dropped (the state is then rebuilt from the database)."""
        with self.reason_writer.held():  # no reasons' chunk starts meanwhile
            batch = self._commit(endings, result, now)
        self.own.update(batch.own_seqs)
        if self.gates.waiting:
            self.gates.recheck = True  # what just ended or started may let a dependent job in
            self.wake = min(self.wake, now)
        self.api_bell.ring()
        if batch.dropped:
            log.warning(
                "dropped %d decision groups (%s); rebuilding state", len(batch.dropped), batch.dropped[0]
            )
            self.reload()
            return False
        return True

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
        with self.engines.reader.connect() as conn:
            rows = db.journal_after(conn, self.last_seq)
        if rows:
            self.last_seq = rows[-1].seq
        out = [r for r in rows if r.seq not in self.own]
        self.own.difference_update(r.seq for r in rows)
        return out

    # ---- writing decisions --------------------------------------------------------------
    def _commit(
        self,
        endings: list[tuple[str, int, Ending]],
        result: CycleResult | None,
        now: float,
    ) -> Batch:
        """Endings, rejections, preemptions and starts: one fenced transaction, nothing else."""
        state = self.state
        assert state is not None
        if result is not None and result.starts:
            _fault_pause()
        with self.engines.writer.begin() as conn:
            self.fence(conn)
            batch = Batch(conn, self.engines.is_sqlite, now)
            ends = [EndItem(job_id, attempt, ending) for job_id, attempt, ending in endings]
            batch.groups(batch.ends, ends, lambda e: f"end {e.job}")
            if result is not None:
                self._decisions(batch, result)
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
                estimate = running.job.estimate if running is not None else None
                items.append(StartItem(s, s.attempt - 1, request, run_as, limit, estimate))
            written = batch.groups(batch.starts, items, lambda i: f"start {i.start.job}")
            for item, ok in zip(items, written, strict=True):
                if ok:
                    metrics.ADMISSION_WAIT.observe(max(0.0, batch.now - extra[item.start.job][2]))

    def _start_extras(self, ids: list[str]) -> dict[str, tuple[dict[str, Any], str, float]]:
        with self.engines.reader.connect() as conn:
            return db.start_extras(conn, ids)


def _fault_pause() -> None:
    """Fault injection for the tests of the fence (tests/server/test_ha.py): when the file named by
    `CORRAL_FAULT_STOP_BEFORE_COMMIT` exists, remove it and stop this process (SIGSTOP) with the
    cycle's starts decided but not written; they are written, or refused, when it is continued."""
    path = os.environ.get(FAULT_STOP_BEFORE_COMMIT)
    if path and os.path.exists(path):
        os.unlink(path)
        log.warning("fault injection: stopping before a commit")
        os.kill(os.getpid(), signal.SIGSTOP)


def _decided(result: CycleResult) -> bool:
    return bool(result.starts or result.preemptions or result.rejections)
