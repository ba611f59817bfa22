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
from dataclasses import dataclass, field
from typing import cast

from corral.config.cluster_file import ClusterConfig
from corral.core.cycle import schedule
from corral.core.decisions import CycleResult
from corral.core.errors import TraceError
from corral.core.model import JobId, JobSpec, NodeName, NodeState, QueueName, QueueSpec, Topology
from corral.core.placement import Request
from corral.core.plugins import Profile
from corral.core.request import request_for
from corral.core.state import ClusterState
from corral.sim.eventlog import EventLog, placement_json
from corral.sim.ideal import IdealSpans
from corral.sim.jobmodel import PreemptionCost, Slowdown
from corral.sim.trace import TraceJob

_END, _STOP, _FAIL_NODE, _REPAIR, _CYCLE = 0, 1, 2, 3, 9


@dataclass(frozen=True, slots=True)
class SimOptions:
    min_interval: float = 0.0  # seconds between cycles at the least
    slowdown: Slowdown = field(default_factory=Slowdown)
    preemption: PreemptionCost = field(default_factory=PreemptionCost)
    node_mtbf: float | None = None  # mean seconds between failures of one node
    node_repair: float = 3600.0
    seed: int = 0


@dataclass(slots=True, eq=False)
class _Job:
    trace: TraceJob
    spec: JobSpec
    work: float  # seconds of work left, at the ideal placement
    progress: float = 0.0  # seconds of work done and kept (checkpointed) so far
    attempt: int = 0
    started: float = 0.0
    factor: float = 1.0


@dataclass(slots=True)
class SimStats:
    """What the run did, besides the event log."""

    end_time: float = 0.0
    cycles: int = 0
    jobs: int = 0
    time_limit_rules: dict[str, int] = field(
        default_factory=lambda: {"trace": 0, "queue default": 0, "none": 0}
    )


class Simulation:
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
        self.ideal = IdealSpans(self.state)
        self.stats = SimStats()
        self.jobs: dict[str, _Job] = {}
        self._queues: dict[str, QueueSpec] = {q.name: q for q in cluster.queues}
        ordered = sorted(trace, key=lambda t: t.submit_time)  # stable: ties keep row order
        self.arrivals = [self._job(t, seq) for seq, t in enumerate(ordered)]
        self.stats.jobs = len(self.arrivals)
        self.events: list[tuple[float, int, int, object]] = []
        self._n = 0
        self.rng = random.Random(options.seed)
        self.on_progress: Callable[[int], None] | None = None  # called with the jobs submitted so far

    # ---- set-up --------------------------------------------------------------------------
    def _job(self, t: TraceJob, seq: int) -> _Job:
        c = self.cluster
        queue_name = t.queue if t.queue is not None else (c.queues[0].name if c.queues else "default")
        queue = self._queues.get(queue_name)
        if queue is None:
            known = ", ".join(q.name for q in c.queues)
            raise TraceError(
                f"job {t.job_id}: queue {queue_name!r} is not in the cluster file (queues: {known})"
            )
        class_name = t.priority or c.default_priority
        try:
            pclass = c.priority_class(class_name)
        except KeyError:
            known = ", ".join(p.name for p in c.priority_classes)
            raise TraceError(
                f"job {t.job_id}: unknown priority class {class_name!r} (classes: {known})"
            ) from None
        limit = t.time_limit
        rules = self.stats.time_limit_rules
        if limit is not None:
            rules["trace"] += 1
        elif queue.default_time_limit is not None:
            limit = queue.default_time_limit
            rules["queue default"] += 1
        else:
            rules["none"] += 1
        spec = JobSpec(
            JobId(t.job_id), QueueName(queue_name), replicas=t.replicas, gpus_per_replica=t.gpus_per_replica,
            priority=pclass.value, priority_class=pclass.name, submit_time=t.submit_time, seq=seq,
            time_limit=limit, preemptible=t.preemptible, gpu_model=t.gpu_model, user=t.user or "",
            topology=Topology(),
        )  # fmt: skip
        return _Job(t, spec, t.duration)

    def _push(self, t: float, kind: int, payload: object) -> None:
        self._n += 1
        heapq.heappush(self.events, (t, kind, self._n, payload))

    # ---- the loop -----------------------------------------------------------------------
    def run(self) -> SimStats:
        gc.freeze()  # the trace and the cluster live for the whole run: keep them out of collections
        c = self.cluster
        self.log.cluster(c.topology, c.nodes, c.queues, c.priority_classes)
        if self.options.node_mtbf:
            for name in self.state.node_ids:
                self._push(self.rng.expovariate(1.0 / self.options.node_mtbf), _FAIL_NODE, name)
        arrivals, i, n = self.arrivals, 0, len(self.arrivals)
        events = self.events
        last_cycle = -1e300
        cycle_due = False
        now = 0.0
        while i < n or events:
            if i >= n and not self.state.jobs and not self.state.running:
                break  # only node failures and repairs are left: the trace is done
            t_next = arrivals[i].trace.submit_time if i < n else float("inf")
            if events and events[0][0] <= t_next:
                t_next = events[0][0]
            now = t_next
            changed = False
            while events and events[0][0] == now:
                _, kind, _, payload = heapq.heappop(events)
                if kind == _CYCLE:
                    cycle_due = True
                else:
                    changed |= self._handle(kind, payload, now)
            while i < n and arrivals[i].trace.submit_time == now:
                self._submit(arrivals[i], now)
                i += 1
                changed = True
                if self.on_progress is not None and not i % 1024:
                    self.on_progress(i)
            if not (changed or cycle_due) or not self.state.jobs:
                continue
            if now - last_cycle < self.options.min_interval:
                if not cycle_due:
                    self._push(last_cycle + self.options.min_interval, _CYCLE, None)
                    cycle_due = True
                continue
            cycle_due = False
            last_cycle = now
            self._cycle(now)
            if not events and i >= n and self.state.jobs and not self.state.running:
                self._stuck(now)
                break
        self.stats.end_time = now
        return self.stats

    def _stuck(self, now: float) -> None:
        """Nothing runs and nothing will arrive: the rest can never start (e.g. nodes down forever)."""
        for job_id in list(self.state.jobs):
            self.state.remove_pending(job_id)
            self.log.emit(
                {"event": "reject", "t": now, "job": job_id, "reason": "can never start: the cluster is idle"}
            )

    def _submit(self, job: _Job, now: float) -> None:
        spec = job.spec
        self.jobs[spec.id] = job
        self.state.submit(spec, true_duration=job.trace.duration)
        self.log.emit(
            {
                "event": "submit", "t": now, "job": spec.id, "queue": spec.queue, "replicas": spec.replicas,
                "gpus_per_replica": spec.gpus_per_replica, "priority": spec.priority,
                "priority_class": spec.priority_class, "gpu_model": list(spec.gpu_model),
                "topology": {"pack": None, "required": False}, "time_limit": spec.time_limit,
                "preemptible": spec.preemptible, "user": spec.user, "duration": job.trace.duration,
            }
        )  # fmt: skip

    def _cycle(self, now: float) -> None:
        self.stats.cycles += 1
        result = schedule(self.state, self.profile, now)
        for r in result.rejections:
            self.log.emit({"event": "reject", "t": now, "job": r.job, "reason": r.reason})
            del self.jobs[r.job]
        for p in result.preemptions:
            self.log.emit(
                {
                    "event": "preempting",
                    "t": now,
                    "job": p.job,
                    "attempt": p.attempt,
                    "by": p.by,
                    "deadline": p.deadline,
                }
            )
            self._push(p.deadline, _STOP, (p.job, p.attempt, p.reason))
        self._starts(result, now)

    def _starts(self, result: CycleResult, now: float) -> None:
        state = self.state
        for s in result.starts:
            job = self.jobs[s.job]
            attempt = state.running[s.job]
            span = _span(state, attempt.placement)
            req = attempt.job.request
            if not isinstance(req, Request):
                req = request_for(state, job.spec, self.profile.filters, attempt.job.shape)
            ideal = self.ideal.of(req)
            job.attempt, job.started = s.attempt, now
            job.factor = self.options.slowdown.factor(span, ideal)
            names = state.topology.span_names
            self.log.emit(
                {
                    "event": "start", "t": now, "job": s.job, "attempt": s.attempt,
                    "placement": placement_json(s.placement), "span": names[span], "ideal_span": names[ideal],
                    "backfilled": s.backfilled,
                }
            )  # fmt: skip
            run_time = job.work * job.factor
            limit = job.spec.time_limit
            if limit is not None and limit < run_time:
                self._push(now + limit, _END, (s.job, s.attempt, "time_limit"))
            else:
                self._push(now + run_time, _END, (s.job, s.attempt, None))

    # ---- events -------------------------------------------------------------------------
    def _handle(self, kind: int, payload: object, now: float) -> bool:
        if kind in (_END, _STOP):
            job_id, attempt, note = cast(tuple[str, int, str | None], payload)
            if kind == _END:
                return self._end(job_id, attempt, note, now)
            return self._requeue(job_id, attempt, "preempt", note or "preempted", now)
        name = cast(NodeName, payload)
        if kind == _FAIL_NODE:
            return self._fail_node(name, now)
        if kind == _REPAIR:
            self.state.set_node_state(name, NodeState.UP)
            if self.options.node_mtbf:
                self._push(now + self.rng.expovariate(1.0 / self.options.node_mtbf), _FAIL_NODE, name)
            return True
        return False

    def _end(self, job_id: str, attempt: int, failure: str | None, now: float) -> bool:
        running = self.state.running.get(JobId(job_id))
        if running is None or running.attempt != attempt:
            return False  # a stale end: the attempt was preempted or lost meanwhile
        self.state.end(JobId(job_id), requeue=False, now=now)
        if failure is None:
            self.log.emit({"event": "finish", "t": now, "job": job_id, "attempt": attempt})
        else:
            self.log.emit({"event": "fail", "t": now, "job": job_id, "attempt": attempt, "reason": failure})
        del self.jobs[job_id]
        return True

    def _requeue(self, job_id: str, attempt: int, kind: str, reason: str, now: float) -> bool:
        running = self.state.running.get(JobId(job_id))
        if running is None or running.attempt != attempt:
            return False
        job = self.jobs[job_id]
        done = (now - job.started) / job.factor  # seconds of work done by this attempt
        reached = job.progress + min(done, job.work)
        kept = max(job.progress, self.options.preemption.saved(reached, job.trace.checkpoint_interval))
        lost = (reached - kept) * job.factor * job.spec.gpus
        job.work = job.trace.duration - kept + self.options.preemption.restart_overhead
        job.progress = kept
        self.state.end(JobId(job_id), requeue=True, now=now)
        self.log.emit(
            {
                "event": kind,
                "t": now,
                "job": job_id,
                "attempt": attempt,
                "reason": reason,
                "lost_gpu_seconds": lost,
            }
        )
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


def _span(state: ClusterState, placement: list[tuple[int, int]]) -> int:
    """The tightest span index that holds a placement."""
    first = placement[0][0]
    if all(n == first for n, _ in placement):
        masks = state.group_masks[first]
        if len(masks) == 1:
            return 0
        used = 0
        for _, m in placement:
            used |= m
        return 0 if sum(1 for g in masks if g & used) <= 1 else 1
    return state.topology.span_of([n for n, _ in placement], 2)
