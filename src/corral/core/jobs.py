"""Runtime records of jobs: pending jobs, running attempts, nominations and queue accounting.

These are mutable (slotted) and owned by `ClusterState`; the frozen `JobSpec` inside each
never changes.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from corral.core.estimates import Chain, Estimate
from corral.core.limits import FamilyLimits
from corral.core.model import INFINITY, JobId, JobSpec, QueueSpec


@dataclass(slots=True)
class Nomination:
    """GPUs being freed for a preemptor: nobody else gets them, no more victims are chosen."""

    placement: list[tuple[int, int]]  # (node id, GPU mask) per replica, in rank order
    victims: frozenset[JobId]
    since: float
    # (node id, GPU mask) held for it: its placement's GPUs, or, for a per-node job (which
    # starts alone on its nodes), every GPU of its nodes, so nothing else starts beside it
    held: list[tuple[int, int]]


class PendingJob:
    """A job waiting to start; `attempts` counts earlier attempts (the next is attempts + 1).

    While it waits, a job that is held, nominated, in a restart backoff or kept off some nodes is
    also in its queue's `flagged` set (setting one of these puts it there; a cycle takes it out
    once none applies), so that a cycle can pass over runs of ordinary jobs without visiting each.
    """

    __slots__ = (
        "_avoid_nodes",
        "_held",
        "_nomination",
        "_not_before",
        "attained",
        "attempts",
        "estimate",
        "estimated_hold",
        "family",
        "flags",
        "history_keys",
        "key",
        "promoted",
        "queued_at",
        "request",
        "request_generation",
        "shape",
        "spec",
        "true_duration",
        "verdict_key",
    )

    def __init__(
        self,
        spec: JobSpec,
        attempts: int = 0,
        attained: float = 0.0,
        true_duration: float | None = None,
    ) -> None:
        self.spec = spec
        self.attempts = attempts
        self.attained = attained  # GPU-seconds of service received by earlier attempts
        self.true_duration = true_duration  # known only to the simulator, used only by the sjf oracle
        self.queued_at = spec.submit_time  # when its current wait began (requeued: when its attempt ended)
        self.promoted = False  # waited past its order's promotion time in this wait (`core/aging.py`)
        self._not_before = 0.0  # restart backoff
        self._held = False
        self._nomination: Nomination | None = None
        self.flags: set[PendingJob] | None = None  # its queue's flagged jobs, while it waits
        self._avoid_nodes: frozenset[int] = frozenset()
        self.key: tuple[object, ...] = ()  # its position in the queue's order
        self.shape: tuple[object, ...] | None = None  # placement-relevant fields, computed once
        self.request: object = None  # its placement request, valid while `request_generation` is current
        self.request_generation = -1
        self.verdict_key = -1  # its (shape, queue, class, time limit, preemptible), interned by the state
        self.family = -1  # the same without the time limit, interned by the state
        self.estimate: Estimate | None = None  # its run time from history (`estimates`), set when queued
        self.history_keys: Chain | None = None  # its `Estimator.chain`, resolved once
        # its last reservation from estimated ends: (searched at, start or INFINITY, capacity,
        # the estimate the start rests on), reused for a while (`estimated_holds`)
        self.estimated_hold: tuple[float, float, tuple[tuple[int, int], ...], Estimate | None] | None = None

    def __repr__(self) -> str:
        return f"PendingJob({self.spec.id!r}, attempts={self.attempts})"

    @property
    def held(self) -> bool:
        return self._held

    @held.setter
    def held(self, value: bool) -> None:
        self._held = value
        self._flag()

    @property
    def not_before(self) -> float:
        return self._not_before

    @not_before.setter
    def not_before(self, value: float) -> None:
        self._not_before = value
        self._flag()

    @property
    def nomination(self) -> Nomination | None:
        return self._nomination

    @nomination.setter
    def nomination(self, value: Nomination | None) -> None:
        self._nomination = value
        self._flag()

    @property
    def avoid_nodes(self) -> frozenset[int]:
        """Node ids its placement must not use."""
        return self._avoid_nodes

    @avoid_nodes.setter
    def avoid_nodes(self, value: frozenset[int]) -> None:
        self._avoid_nodes = value
        self._flag()

    def is_flagged(self, now: float) -> bool:
        """Held, nominated, in a restart backoff at `now`, or kept off some nodes."""
        return self._held or self._nomination is not None or self._not_before > now or bool(self._avoid_nodes)

    def join(self, flags: set[PendingJob]) -> None:
        """It waits in the queue whose flagged jobs are `flags`."""
        self.flags = flags
        self._flag()

    def leave(self) -> None:
        """It no longer waits (started, removed)."""
        if self.flags is not None:
            self.flags.discard(self)
        self.flags = None

    def _flag(self) -> None:
        if self.flags is not None and (
            self._held or self._nomination is not None or self._not_before or self._avoid_nodes
        ):
            self.flags.add(self)


def shape_of(spec: JobSpec) -> tuple[object, ...]:
    """Everything about a job that placement depends on (jobs of one shape place alike)."""
    return (
        spec.replicas,
        spec.gpus_per_replica,
        spec.gpu_model,
        spec.gpu_memory_gib,
        tuple(sorted(spec.node_selector.items())),
        spec.topology.pack,
        spec.topology.required,
        spec.launch.value,  # its value: an enum member hashes in Python, a string in C
        spec.cpus_per_replica,
        spec.memory_gib_per_replica,
    )


@dataclass(slots=True, eq=False, init=False)
class RunningAttempt:
    """One live attempt of a job on one placement. (`__init__` written out, as dataclasses would
    make it: the compiled core runs it natively.)"""

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
    # without a time limit: when history says it ends (`estimates`; never a limit), and its entry
    # in ClusterState.by_estimate (seq negated: an estimated end, not a limit)
    estimated_end: float = INFINITY
    estimate: Estimate | None = None
    estimate_key: tuple[float, int, JobId] | None = None

    def __init__(
        self,
        job: PendingJob,
        attempt: int,
        placement: list[tuple[int, int]],
        start: float,
        limit_end: float,
        last_checkpoint: float,
        cpus: int = 0,
        memory_gib: float = 0.0,
        exclusive: bool = False,
        preempting_deadline: float | None = None,
        preempted_by: JobId | None = None,
        end_key: tuple[float, int, JobId] | None = None,
        candidate: int = 0,
        estimated_end: float = INFINITY,
        estimate: Estimate | None = None,
        estimate_key: tuple[float, int, JobId] | None = None,
    ) -> None:
        self.job = job
        self.attempt = attempt
        self.placement = placement
        self.start = start
        self.limit_end = limit_end
        self.last_checkpoint = last_checkpoint
        self.cpus = cpus
        self.memory_gib = memory_gib
        self.exclusive = exclusive
        self.preempting_deadline = preempting_deadline
        self.preempted_by = preempted_by
        self.end_key = end_key
        self.candidate = candidate
        self.estimated_end = estimated_end
        self.estimate = estimate
        self.estimate_key = estimate_key

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


Key = tuple[object, ...]
PartOf = Callable[[PendingJob], int]


class FamilyParts:
    """A queue's pending jobs per family and part (`Victims.family_part`, an int that a job keeps
    while it waits), each part's order keys sorted: where a family's parts change, found by
    bisection (`stop`) instead of visiting its jobs. Kept up to date as jobs enter and leave;
    a family is split when first asked about, and everything is dropped when the part function
    or the order changes (`use`, `clear`)."""

    __slots__ = ("families", "owner", "part_of")

    def __init__(self) -> None:
        self.owner: object = None  # what `part_of` belongs to (compared by identity)
        self.part_of: PartOf | None = None
        self.families: dict[int, dict[int, list[Key]]] = {}  # family -> part -> sorted keys

    def use(self, owner: object, part_of: PartOf) -> None:
        """Split by `part_of` (of `owner`): forget every split made by another."""
        if owner is not self.owner:
            self.owner, self.part_of, self.families = owner, part_of, {}

    def clear(self) -> None:
        """The order keys changed: split again when asked."""
        self.families = {}

    def add(self, job: PendingJob) -> None:
        parts = self.families.get(job.family)
        if parts is not None and self.part_of is not None:
            insort(parts.setdefault(self.part_of(job), []), job.key)

    def remove(self, job: PendingJob) -> None:
        parts = self.families.get(job.family)
        if parts is None or self.part_of is None:
            return
        value = self.part_of(job)
        keys = parts[value]
        del keys[bisect_left(keys, job.key)]
        if not keys:
            del parts[value]
            if not parts:
                del self.families[job.family]

    def of(self, family: int, keys: list[Key], jobs: Mapping[JobId, PendingJob]) -> dict[int, list[Key]]:
        """The family's keys (`keys`, sorted: its whole order) per part."""
        parts = self.families.get(family)
        if parts is None:
            assert self.part_of is not None
            parts = self.families[family] = {}
            part_of = self.part_of
            for key in keys:  # in order: each part's list comes out sorted
                parts.setdefault(part_of(jobs[key[-1]]), []).append(key)  # type: ignore[index]
        return parts

    def stop(
        self, family: int, keys: list[Key], jobs: Mapping[JobId, PendingJob], pos: int, part: int
    ) -> int:
        """The index in `keys` of the first job from `pos` on whose part is not `part`."""
        if pos >= len(keys):
            return pos
        at, best = keys[pos], len(keys)
        for value, mine in self.of(family, keys, jobs).items():
            if value != part:
                i = bisect_left(mine, at)
                if i < len(mine):
                    best = min(best, bisect_left(keys, mine[i], pos))
        return best


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
    # the order keys of the pending jobs per `PendingJob.verdict_key`, each list sorted
    by_verdict: dict[int, list[tuple[object, ...]]] = field(default_factory=dict)
    # the same per `PendingJob.family` (jobs that differ at most by their time limits)
    by_family: dict[int, list[tuple[object, ...]]] = field(default_factory=dict)
    flagged: set[PendingJob] = field(default_factory=set)  # see `PendingJob`
    parts: FamilyParts = field(default_factory=FamilyParts)  # its families' jobs by part
    limits: FamilyLimits = field(default_factory=FamilyLimits)  # ... and by time limit

    @property
    def effective_gpus(self) -> int:
        """GPUs counted for quotas and reclaim: allocated, minus leaving, plus nominated."""
        return self.alloc_gpus - self.leaving_gpus + self.incoming_gpus

    def time_limit(self, job_id: JobId) -> float | None:
        return self.pending[job_id].spec.time_limit

    def enter(self, job: PendingJob) -> None:
        """Put a pending job (its `key` set) into the per-verdict and per-family orders."""
        insort(self.by_verdict.setdefault(job.verdict_key, []), job.key)
        family = self.by_family.setdefault(job.family, [])
        insort(family, job.key)
        self.parts.add(job)
        self.limits.add(job.family, job.key, job.spec.time_limit, len(family) == 1)

    def leave_family(self, job: PendingJob) -> None:
        """Take a job out of the per-family order (the per-verdict order is its caller's)."""
        keys = self.by_family[job.family]
        del keys[bisect_left(keys, job.key)]
        if not keys:
            del self.by_family[job.family]
        self.parts.remove(job)
        self.limits.remove(job.family, job.key)


NO_END = INFINITY
