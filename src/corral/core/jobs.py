"""Runtime records of jobs: pending jobs, running attempts, nominations and queue accounting.

These are mutable (slotted) and owned by `ClusterState`; the frozen `JobSpec` inside each
never changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from corral.core.model import INFINITY, JobId, JobSpec, QueueSpec


@dataclass(slots=True)
class Nomination:
    """GPUs being freed for a preemptor: nobody else gets them, no more victims are chosen."""

    placement: list[tuple[int, int]]  # (node id, GPU mask) per replica, in rank order
    victims: frozenset[JobId]
    since: float


@dataclass(slots=True, eq=False)
class PendingJob:
    """A job waiting to start; `attempts` counts earlier attempts (the next is attempts + 1)."""

    spec: JobSpec
    attempts: int = 0
    attained: float = 0.0  # GPU-seconds of service received by earlier attempts
    not_before: float = 0.0  # restart backoff
    held: bool = False
    nomination: Nomination | None = None
    avoid_nodes: frozenset[int] = frozenset()
    key: tuple[object, ...] = ()
    true_duration: float | None = None  # known only to the simulator, used only by the sjf oracle
    shape: tuple[object, ...] | None = None  # placement-relevant fields, computed once
    request: object = None  # its placement request, valid while `request_generation` is current
    request_generation: int = -1
    verdict_key: int = -1  # its (shape, queue, class, time limit, preemptible), interned by the state


@dataclass(slots=True, eq=False)
class RunningAttempt:
    """One live attempt of a job on one placement."""

    job: PendingJob
    attempt: int
    placement: list[tuple[int, int]]  # (node id, GPU mask) per replica, in rank order
    start: float
    limit_end: float  # start + time limit, or INFINITY
    last_checkpoint: float  # time of the newest recorded checkpoint (start when none)
    cpus: int = 0
    memory_gib: float = 0.0
    exclusive: bool = False
    preempting_deadline: float | None = None
    preempted_by: JobId | None = None
    end_key: tuple[float, int, JobId] | None = None  # its entry in ClusterState.by_end
    candidate: int = 0  # as a victim, for `Occupancy`: 0 never (now), 1 inside min_runtime, 2 counted

    @property
    def spec(self) -> JobSpec:
        return self.job.spec

    @property
    def expected_end(self) -> float:
        """When the attempt ends at the latest: its time limit, or its preemption deadline."""
        if self.preempting_deadline is not None:
            return min(self.limit_end, self.preempting_deadline)
        return self.limit_end

    def lost_work(self, now: float) -> float:
        """GPU-seconds a preemption now would lose: work since the last checkpoint plus the grace."""
        gpus = self.job.spec.gpus
        return gpus * (max(0.0, now - max(self.start, self.last_checkpoint)) + self.job.spec.checkpoint_grace)


@dataclass(slots=True, eq=False)
class QueueState:
    """A queue's spec, its current allocation and its pending jobs (sorted by the order key)."""

    spec: QueueSpec
    alloc_gpus: int = 0
    alloc_cpus: int = 0
    alloc_memory: float = 0.0
    leaving_gpus: int = 0  # held by attempts being preempted
    incoming_gpus: int = 0  # nominated to this queue's preemptors
    usage: float = 0.0  # decayed GPU-seconds
    pending_keys: list[tuple[object, ...]] = field(default_factory=list)
    pending: dict[JobId, PendingJob] = field(default_factory=dict)

    @property
    def effective_gpus(self) -> int:
        """GPUs counted for quotas and reclaim: allocated, minus leaving, plus nominated."""
        return self.alloc_gpus - self.leaving_gpus + self.incoming_gpus


NO_END = INFINITY
