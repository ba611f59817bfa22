"""The simulator: replays a trace through the scheduling core on an event-driven virtual clock.

It is one more adapter of the core (DESIGN.md 1): it submits jobs as they arrive, calls
`schedule()` after events (no more often than `min_interval`), and carries decisions out by
advancing virtual time: starts run for their work times the placement's slowdown, time limits
fail attempts, preempted victims stop at their deadline and lose work since their last
checkpoint, failed nodes lose their attempts. Every step is written to the event log.
"""

from __future__ import annotations

import gc
import heapq
import random
from collections.abc import Callable, Sequence
from typing import cast

from corral.config.array_spec import MET, NEVER
from corral.config.cluster_file import ClusterConfig
from corral.core.cycle import schedule
from corral.core.decisions import CycleResult
from corral.core.estimates import Estimator
from corral.core.eventshape import ending_line, preempting_line, reject_line, start_line, submit_line
from corral.core.model import (
    INFINITY,
    JobId,
    NodeName,
    NodeState,
    Placement,
)
from corral.core.placement import Request
from corral.core.plugins import Profile
from corral.core.quiet import Quiet, skip
from corral.core.quiet_las import LasQuiet
from corral.core.quiet_las import skip as skip_las
from corral.core.request import request_for
from corral.core.state import ClusterState
from corral.sim.dependencies import DependencyBook
from corral.sim.eventlog import EventLog, placement_json
from corral.sim.gcpause import rare_collections
from corral.sim.ideal import IdealSpans
from corral.sim.options import SimOptions, SimStats
from corral.sim.simjob import JobMaker, SimJob, span_of
from corral.sim.timeline import _CHECKPOINT, _CYCLE, _END, _FAIL_NODE, _REPAIR, _STOP, Timeline
from corral.sim.trace import TraceJob

__all__ = ["SimOptions", "SimStats", "Simulation"]  # the options live in sim/options.py

_Ending = tuple[JobId, int, "str | None"]  # the payload of _END and _STOP: job, attempt, note


class Simulation(Timeline):
    """One replay of one trace under one policy."""

    def __init__(
        self,
        cluster: ClusterConfig,
        trace: Sequence[TraceJob],
        profile: Profile,
        log: EventLog,
        options: SimOptions | None = None,
    ) -> None:
        options = options or SimOptions()
        self.cluster = cluster
        self.profile = profile
        self.log = log
        self.options = options
        self.state = ClusterState.build(
            cluster.topology, cluster.nodes, cluster.queues, cluster.priority_classes
        )
        if profile.uses_estimates:  # learns from the jobs that finish earlier in the replay
            self.state.estimator = Estimator()
        self.ideal = IdealSpans(self.state)
        self.stats = SimStats()
        self.jobs = {}
        self._factors: dict[tuple[int, int], float] = {}  # (span, ideal span) -> slowdown factor
        maker = JobMaker(cluster, self.stats.time_limit_rules)
        ordered = sorted(trace, key=lambda t: t.submit_time)  # stable: ties keep row order
        with rare_collections():
            self.arrivals = [maker.make(t, seq) for seq, t in enumerate(ordered)]
        self.stats.jobs = len(self.arrivals)
        # the trace's dependency column (sim/dependencies.py); None when no job has one
        self.deps: DependencyBook | None = DependencyBook.of([(t.job_id, t.dependency) for t in ordered])
        self.events = []
        self._checkpoints = []  # the periodic checkpoints, when folded (`Timeline`)
        self._n = 0
        self.rng = random.Random(options.seed)
        self.on_progress: Callable[[int], None] | None = None  # called with the jobs submitted so far
        self.on_cycle: Callable[[CycleResult], None] | None = None  # called with every cycle's decisions
        self._begun = False
        self._arrived = 0  # arrivals submitted so far
        self._last_cycle = -1e300
        self._cycle_due = False
        self._wake = INFINITY  # the last cycle's `next_wake`: a _CYCLE event carrying it is queued
        # the last cycle's `checkpoint_wakes`: a checkpoint of an attempt of these (queue, class)
        # groups may give a waiting job a victim, so a cycle follows within the seconds given
        # (half of them after the checkpoint: the checkpoints until then share that cycle)
        self._checkpoint_wakes = {}
        self._fresh_due = None  # the _CYCLE event queued for them
        # what the last cycle left for arrivals alone (`core/quiet.py`), while nothing else changed
        self._quiet: Quiet | None = None

    # ---- the loop -----------------------------------------------------------------------
    def run(self) -> SimStats:
        """Replay the whole trace."""
        self.begin()
        with rare_collections():
            while self.step():
                pass
        return self.stats

    def begin(self) -> None:
        """Log the cluster and draw the first node failures; `step` then plays one instant at a time."""
        if self._begun:
            return
        self._begun = True
        gc.freeze()  # the trace and the cluster live for the whole run: keep them out of collections
        c = self.cluster
        self.log.cluster(c.topology, c.nodes, c.queues, c.priority_classes)
        if self.options.node_mtbf:
            for name in self.state.node_ids:
                self._push(self.rng.expovariate(1.0 / self.options.node_mtbf), _FAIL_NODE, name)

    @property
    def arrived(self) -> int:
        """How many of the trace's jobs have been submitted so far."""
        return self._arrived

    def step(self) -> bool:
        """Play the next instant: its events (endings first), its arrivals, then a cycle if due.

        False when the replay is over: nothing is left, or only node failures and repairs are
        (the trace is done), or nothing runs and nothing will arrive (the rest is rejected).
        """
        arrivals, events, state, checkpoints = self.arrivals, self.events, self.state, self._checkpoints
        i, n = self._arrived, len(arrivals)
        if (i >= n and not events and not checkpoints) or (i >= n and not state.jobs and not state.running):
            return False
        t_next = arrivals[i].trace.submit_time if i < n else INFINITY
        if events and events[0][0] <= t_next:
            t_next = events[0][0]
        if checkpoints and checkpoints[0][0] < t_next:
            played = self._played(t_next)
            t_next = played if played < t_next else self._fold(t_next)
        now = self.stats.end_time = t_next
        changed = False
        while True:
            due = bool(events) and events[0][0] == now
            if checkpoints and checkpoints[0][0] == now and not (due and events[0][1] < _CHECKPOINT):
                _, _, job_id, attempt = checkpoints[0]  # after ends, stops, failures, repairs
                self._checkpoint(job_id, attempt, now, True)
                continue
            if not due:
                break
            _, kind, _, payload = heapq.heappop(events)
            if kind == _CYCLE:  # the minimum interval has passed, or the last cycle's wake-up is due
                self._cycle_due = (
                    self._cycle_due or payload is None or payload == self._wake or payload == self._fresh_due
                )
            else:
                changed |= self._handle(kind, payload, now)
        if changed or self._cycle_due or self._fresh_due is not None:
            self._quiet = None  # more than arrivals changed since the last cycle
        while i < n and arrivals[i].trace.submit_time == now:
            self._submit(arrivals[i], now)
            i += 1
            changed = True
            if self.on_progress is not None and not i % 1024:
                self.on_progress(i)
        self._arrived = i
        if not (changed or self._cycle_due) or not state.jobs:
            return True
        interval = self.options.min_interval
        if now - self._last_cycle < interval:
            if not self._cycle_due:
                self._push(self._last_cycle + interval, _CYCLE, None)
                self._cycle_due = True
            return True
        self._cycle_due = False
        self._last_cycle = now
        quiet = self._quiet
        if quiet is not None and self.on_cycle is not None and quiet.told is None:
            quiet = None  # (`on_cycle` set after the last cycle, which did not keep every reason)
        if quiet is None:
            told = None
        elif isinstance(quiet, LasQuiet):
            told = skip_las(state, self.profile, now, quiet)
        else:
            told = skip(state, self.profile, now, quiet)
        if told is not None:
            self.stats.cycles += 1
            self.stats.skipped += 1
            if self.on_cycle is not None:
                self.on_cycle(told)
        else:
            self._cycle(now)
        if i >= n and state.jobs and not state.running and self._only_failures_due():
            self._stuck(now)
            return False
        return True

    def _stuck(self, now: float) -> None:
        """Nothing runs and nothing will arrive: the rest can never start (e.g. nodes down forever)."""
        while self.state.jobs:  # rejecting one may let in a job that waited for it to end
            job_id = next(iter(self.state.jobs))
            self.state.remove_pending(job_id)
            self.log.emit(reject_line(now, job_id, "can never start: the cluster is idle"))
            self._settled(job_id, now, False)

    def _submit(self, job: SimJob, now: float) -> None:
        spec = job.spec
        self.jobs[spec.id] = job
        gated = self.deps is not None and spec.id in self.deps.conditions
        if not gated:
            self.state.submit(spec, true_duration=job.trace.duration)
        extra: dict[str, object] = {"duration": job.trace.duration}
        if gated:
            extra["dependency"] = job.trace.dependency
        self.log.emit(submit_line(spec, now, extra))
        if gated:
            self._gate(spec.id, now)

    def _gate(self, job_id: str, now: float) -> None:
        """A job with a dependency: let in (and ask for a cycle), cancel, or keep it waiting."""
        deps = self.deps
        assert deps is not None
        verdict, why = deps.holds(job_id)
        if verdict == MET:
            deps.parked.discard(job_id)
            job = self.jobs[job_id]
            self.state.submit(job.spec, true_duration=job.trace.duration, queued_at=now)
            self._push(now, _CYCLE, None)
        elif verdict == NEVER:
            deps.parked.discard(job_id)
            self.log.emit({"event": "cancel", "t": now, "job": job_id, "reason": why})
            del self.jobs[job_id]
            self._settled(job_id, now, False)
        else:
            deps.parked.add(job_id)

    def _settled(self, job_id: str, now: float, ok: bool | None) -> None:
        """A job started (`ok` None) or ended: judge again the jobs that wait for it."""
        if self.deps is not None:
            for waiter in self.deps.settle(job_id, ok=ok):
                self._gate(waiter, now)

    def _cycle(self, now: float) -> None:
        self.stats.cycles += 1
        self.state.runs_read = self.on_cycle is not None  # else no one reads the reasons
        self.state.words_read = self.state.runs_read  # ... nor their words
        self.state.quiet_kept = self.options.skip_quiet and self.deps is None
        result = schedule(self.state, self.profile, now)
        self._quiet = result.quiet if self.options.skip_quiet and self.deps is None else None
        wake = result.next_wake  # e.g. a victim's min_runtime ends: nothing else may happen then
        self._checkpoint_wakes = result.checkpoint_wakes
        self._fresh_due = None  # this cycle saw every checkpoint so far
        if wake != self._wake:
            self._wake = wake
            if wake < INFINITY:
                self._push(wake, _CYCLE, wake)
        if self.on_cycle is not None:
            self.on_cycle(result)
        for r in result.rejections:
            self.log.emit(reject_line(now, r.job, r.reason))
            del self.jobs[r.job]
            self._settled(r.job, now, False)
        for p in result.preemptions:
            self.log.emit(preempting_line(now, p.job, p.attempt, p.by, p.deadline))
            self._push(p.deadline, _STOP, (p.job, p.attempt, p.reason))
        self._starts(result, now)

    def _starts(self, result: CycleResult, now: float) -> None:
        for s in result.starts:
            self._launch(s.job, s.attempt, s.placement, s.backfilled, now)

    def _launch(
        self, job_id: str, attempt_no: int, placement: Placement, backfilled: bool, now: float
    ) -> None:
        """An attempt started: its slowdown, its `start` event, and when it ends."""
        state = self.state
        job = self.jobs[job_id]
        attempt = state.running[cast(JobId, job_id)]
        span = span_of(state, attempt.placement)
        req = attempt.job.request
        if not isinstance(req, Request):
            req = request_for(state, job.spec, attempt.job.shape)
        ideal = self.ideal.of(req)
        job.attempt, job.started = attempt_no, now
        factor = self._factors.get((span, ideal))
        if factor is None:
            factor = self._factors[span, ideal] = self.options.slowdown.factor(span, ideal)
        job.factor = factor
        names = state.topology.span_names
        extra = {"span": names[span], "ideal_span": names[ideal], "backfilled": backfilled}
        self.log.emit(start_line(now, job_id, attempt_no, placement_json(placement), extra))
        self._settled(job_id, now, None)
        run_time = job.work * job.factor
        limit = job.spec.time_limit
        if limit is not None and limit < run_time:
            self._push(now + limit, _END, (job_id, attempt_no, "time_limit"))
        else:
            self._push(now + run_time, _END, (job_id, attempt_no, None))
        self._next_checkpoint(job, now)

    # ---- events -------------------------------------------------------------------------
    def _handle(self, kind: int, payload: object, now: float) -> bool:
        if kind == _END:
            job_id, attempt_no, failure = cast(_Ending, payload)  # (no call through star-args)
            return self._end(job_id, attempt_no, failure, now)
        if kind == _STOP:
            job_id, attempt, note = cast(_Ending, payload)
            return self._requeue(job_id, attempt, "preempt", note or "preempted", now)
        if kind == _CHECKPOINT:
            job_id, attempt, _ = cast(_Ending, payload)
            self._checkpoint(job_id, attempt, now)
            return False
        name = cast(NodeName, payload)
        if kind == _FAIL_NODE:
            return self._fail_node(name, now)
        if kind == _REPAIR:
            self.state.set_node_state(name, NodeState.UP)
            if self.options.node_mtbf:
                self._push(now + self.rng.expovariate(1.0 / self.options.node_mtbf), _FAIL_NODE, name)
            return True
        return False

    def _end(self, job_id: JobId, attempt: int, failure: str | None, now: float) -> bool:
        running = self.state.running.get(job_id)
        if running is None or running.attempt != attempt:
            return False  # a stale end: the attempt was preempted or lost meanwhile
        self.state.end(job_id, requeue=False, now=now)
        if failure is None:
            self.log.emit(ending_line("finish", now, job_id, attempt))
        else:
            self.log.emit(ending_line("fail", now, job_id, attempt, failure))
        del self.jobs[job_id]
        self._settled(job_id, now, failure is None)
        return True

    def _requeue(self, job_id: str, attempt: int, kind: str, reason: str, now: float) -> bool:
        running = self.state.running.get(cast(JobId, job_id))
        if running is None or running.attempt != attempt:
            return False
        job = self.jobs[job_id]
        done = (now - job.started) / job.factor  # seconds of work done by this attempt
        reached = job.progress + min(done, job.work)
        kept = max(job.progress, self.options.preemption.saved(reached, job.trace.checkpoint_interval))
        lost = (reached - kept) * job.factor * job.spec.gpus
        job.work = job.trace.duration - kept + self.options.preemption.restart_overhead
        job.progress = kept
        self.state.end(running.spec.id, requeue=True, now=now)
        self.log.emit(ending_line(kind, now, job_id, attempt, reason, extra={"lost_gpu_seconds": lost}))
        return True

    def _fail_node(self, name: NodeName, now: float) -> bool:
        state = self.state
        node = state.node_ids[name]
        state.set_node_state(name, NodeState.DOWN)
        victims = [a for a in state.running.values() if any(n == node for n, _ in a.placement)]
        for a in victims:
            self._requeue(a.spec.id, a.attempt, "lost", f"node {name} failed", now)
        self._push(now + self.options.node_repair, _REPAIR, name)
        return True
