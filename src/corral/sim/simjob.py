"""A trace's job inside a replay (`sim/engine.py`): its spec, resolved from the trace row and the
cluster file, and how far its work has got (the work left, the part kept by checkpoints, the
current attempt and its slowdown); when its next periodic checkpoint falls; the span of a
placement, which sets the slowdown."""

from __future__ import annotations

from dataclasses import dataclass

from corral.config.cluster_file import ClusterConfig
from corral.core.errors import TraceError
from corral.core.model import JobId, JobSpec, PriorityClass, QueueName, QueueSpec, Topology
from corral.core.state import ClusterState
from corral.sim.trace import TraceJob

_NO_TOPOLOGY = Topology()  # trace jobs prefer the tightest placement and require none


@dataclass(slots=True, eq=False)
class SimJob:
    trace: TraceJob
    spec: JobSpec
    work: float  # seconds of work left, at the ideal placement
    progress: float = 0.0  # seconds of work done and kept (checkpointed) so far
    attempt: int = 0
    started: float = 0.0
    factor: float = 1.0

    def next_checkpoint(self, now: float, default_interval: float | None) -> float | None:
        """When the attempt's next periodic checkpoint falls, if it has an interval and reaches
        it before it ends (None otherwise): at the next multiple of the interval in seconds of
        work, where a preemption keeps its progress (`PreemptionCost.saved`)."""
        interval = self.trace.checkpoint_interval or default_interval
        if not interval:
            return None
        done = self.progress + (now - self.started) / self.factor  # seconds of work reached by now
        k = done // interval + 1
        at = self.started + (k * interval - self.progress) * self.factor
        if at <= now:  # `now` is a checkpoint that rounding put just short of its multiple
            at = self.started + ((k + 1) * interval - self.progress) * self.factor
        end = self.started + self.work * self.factor
        limit = self.spec.time_limit
        if limit is not None:
            end = min(end, self.started + limit)
        return at if at < end else None


class JobMaker:
    """Resolves trace rows into jobs: queue (the first queue when the row names none), priority
    class (the cluster's default when none), time limit (the row's, else the queue's default);
    counts which rule gave each job its time limit (`rules`)."""

    def __init__(self, cluster: ClusterConfig, rules: dict[str, int]) -> None:
        self.cluster = cluster
        self.rules = rules
        self.queues: dict[str, QueueSpec] = {q.name: q for q in cluster.queues}
        self.classes: dict[str, PriorityClass] = {}
        for pclass in cluster.priority_classes:
            self.classes.setdefault(pclass.name, pclass)  # the first of a name, as `priority_class`

    def make(self, t: TraceJob, seq: int) -> SimJob:
        c = self.cluster
        queue_name = t.queue if t.queue is not None else (c.queues[0].name if c.queues else "default")
        queue = self.queues.get(queue_name)
        if queue is None:
            known = ", ".join(q.name for q in c.queues)
            raise TraceError(
                f"job {t.job_id}: queue {queue_name!r} is not in the cluster file (queues: {known}); "
                "declare the trace's queues there (examples/philly.yaml does for Philly's VCs)"
            )
        class_name = t.priority or c.default_priority
        pclass = self.classes.get(class_name)
        if pclass is None:
            known = ", ".join(p.name for p in c.priority_classes)
            raise TraceError(f"job {t.job_id}: unknown priority class {class_name!r} (classes: {known})")
        limit = t.time_limit
        rules = self.rules
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
            topology=_NO_TOPOLOGY,
        )  # fmt: skip
        return SimJob(t, spec, t.duration)


def trace_of(spec: JobSpec, duration: float, checkpoint_interval: float | None) -> TraceJob:
    """The trace row of a job given by its spec (`GivenSimulation.add` and `restore`, sim/given.py)."""
    return TraceJob(
        job_id=spec.id, submit_time=spec.submit_time, duration=duration, gpus=spec.gpus, queue=spec.queue,
        replicas=spec.replicas, gpus_per_replica=spec.gpus_per_replica, priority=spec.priority_class,
        gpu_model=spec.gpu_model, time_limit=spec.time_limit, preemptible=spec.preemptible,
        checkpoint_interval=checkpoint_interval, user=spec.user or None,
    )  # fmt: skip


def span_of(state: ClusterState, placement: list[tuple[int, int]]) -> int:
    """The tightest span index that holds a placement."""
    first = placement[0][0]
    if len(placement) == 1:
        masks = state.group_masks[first]
        return 0 if len(masks) == 1 or sum(1 for g in masks if g & placement[0][1]) <= 1 else 1
    if all(n == first for n, _ in placement):
        masks = state.group_masks[first]
        if len(masks) == 1:
            return 0
        used = 0
        for _, m in placement:
            used |= m
        return 0 if sum(1 for g in masks if g & used) <= 1 else 1
    return state.topology.span_of([n for n, _ in placement], 2)
