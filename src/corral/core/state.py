"""Cluster state kept incrementally: nodes' GPU masks and the free-count index (`nodes.NodeTable`),
attempts (`attempts.AttemptTable`) and queues.

Adapters (the simulator, the control plane) own one `ClusterState` and tell it what happened
(a node joined, an attempt ended); a cycle changes it only through the plan, so that any
tentative change can be rolled back. Nothing here reads a clock: times are parameters.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Iterable, Sequence
from heapq import heappush

from corral.core.attempts import AttemptTable, history_keys, seconds_run
from corral.core.caches import Caches
from corral.core.errors import InvariantError
from corral.core.jobs import NO_END, Nomination, PendingJob, QueueState, RunningAttempt, shape_of
from corral.core.model import (
    DEFAULT_PRIORITY_CLASSES,
    JobId,
    JobSpec,
    Launch,
    NodeSpec,
    PriorityClass,
    QueueName,
    QueueSpec,
)


class ClusterState(AttemptTable):
    """Everything a cycle works on, changed only through `plan` (or by adapters between cycles)."""

    def __init__(
        self,
        levels: Sequence[str] = (),
        queues: Iterable[QueueSpec] = (),
        priority_classes: Iterable[PriorityClass] = DEFAULT_PRIORITY_CLASSES,
    ) -> None:
        super().__init__(levels)
        self.queues: dict[QueueName, QueueState] = {q.name: QueueState(q) for q in queues}
        self.priority_classes: dict[str, PriorityClass] = {p.name: p for p in priority_classes}
        self.min_runtime_by_value = {p.value: p.min_runtime for p in priority_classes}
        self.jobs: dict[JobId, PendingJob] = {}  # every pending job, by id
        self.unchecked: list[PendingJob] = []  # submitted since the last cycle: feasibility not checked
        # False: the adapter never reads the reasons of the jobs a walk passes over (the simulator
        # without `on_cycle`), so a cycle does not list them (`repeats.Walk`); decisions are the same
        self.runs_read = True
        # False (with `runs_read` false): the adapter reads no reason's words at all (the simulator
        # without `on_cycle`), so capacity sentences are not written: a reason carries its code and
        # `at`, which decisions read (`capacity_reasons.UNREAD_WORDS`); decisions are the same
        self.words_read = True
        # True: the adapter reads what a cycle that decided nothing leaves for the arrivals after it
        # (`CycleResult.quiet`, `core/quiet.py`: the simulator); else no cycle builds it
        self.quiet_kept = False
        # victim searches that reached `preempt._confirm` (whose miss may read the victims' order,
        # which moves with the time) since `quiet_las.leave` last read it
        self.victims_ordered = 0
        self.usage_time: float | None = None
        self.use_version = 0  # bumped whenever any queue's counted GPUs change
        self._interned: dict[tuple[object, ...], int] = {}
        self._last_interned = 0
        self._intern_cap = 1 << 16
        self.key_fn: Callable[[PendingJob], tuple[object, ...]] | None = (
            None  # per-shape results valid until `generation` changes
        )
        # the order's promotion of jobs that waited this long (`core/aging.py`; None: none), and
        # (when, sequence, job id) per wait that reaches it, a heap
        self.promote_after: float | None = None
        self.promotions: list[tuple[float, int, JobId]] = []

    @classmethod
    def build(
        cls,
        levels: Sequence[str],
        nodes: Iterable[NodeSpec],
        queues: Iterable[QueueSpec],
        priority_classes: Iterable[PriorityClass] = DEFAULT_PRIORITY_CLASSES,
    ) -> ClusterState:
        """A state with these nodes (all up) and queues, and nothing running."""
        state = cls(levels, queues, priority_classes)
        for spec in nodes:
            state.add_node(spec)
        return state

    def interned(self, key: tuple[object, ...]) -> int | None:
        """The int `intern` gave this key, if it still holds it (None: none now)."""
        return self._interned.get(key)

    def intern(self, key: tuple[object, ...]) -> int:
        """A small int for a key, never given to another key (cheaper to hash than the tuple)."""
        found = self._interned.get(key)
        if found is None:
            if len(self._interned) >= self._intern_cap:
                self._forget_interned()
            self._last_interned += 1
            found = self._interned[key] = self._last_interned
        return found

    def _forget_interned(self) -> None:
        """Keep only the keys of live jobs (pending or running), with the ids they hold: a key never
        gets a second id while a job holds the first (the counter goes on for new keys)."""
        live: dict[tuple[object, ...], int] = {}
        for job in [*self.jobs.values(), *(a.job for a in self.running.values())]:
            if job.verdict_key >= 0 and job.shape is not None:
                spec = job.spec
                live[((job.shape, spec.queue, spec.priority, spec.time_limit), spec.preemptible)] = (
                    job.verdict_key
                )
                live[(job.shape, spec.queue, spec.priority, spec.preemptible, "family")] = job.family
        self._interned = live
        self._intern_cap = max(1 << 16, 2 * len(live))

    # ---- queues' use --------------------------------------------------------------------
    def add_queue_use(self, queue: QueueState, gpus: int, cpus: int, memory: float) -> None:
        queue.alloc_gpus += gpus
        queue.alloc_cpus += cpus
        queue.alloc_memory += memory
        self.use_version += 1
        self.plan.record(self._sub_queue_use, queue, gpus, cpus, memory)

    def _sub_queue_use(self, queue: QueueState, gpus: int, cpus: int, memory: float) -> None:
        queue.alloc_gpus -= gpus
        queue.alloc_cpus -= cpus
        queue.alloc_memory -= memory
        self.use_version += 1

    def attempt_resources(self, attempt: RunningAttempt) -> Iterable[tuple[int, int, int, float]]:
        """(node, mask, cpus, memory) per replica of an attempt."""
        spec = attempt.spec
        for node, mask in attempt.placement:
            yield node, mask, spec.cpus_per_replica, spec.memory_gib_per_replica

    # ---- adapters' view of jobs ----------------------------------------------------------
    def queue(self, name: QueueName) -> QueueState:
        try:
            return self.queues[name]
        except KeyError:
            raise KeyError(f"unknown queue {name!r}; known: {', '.join(sorted(self.queues))}") from None

    def add_queue(self, spec: QueueSpec) -> None:
        if spec.name in self.queues:
            self.queues[spec.name].spec = spec
        else:
            self.queues[spec.name] = QueueState(spec)
        self.generation += 1
        self.caches = Caches()

    def submit(
        self,
        spec: JobSpec,
        attempts: int = 0,
        attained: float = 0.0,
        true_duration: float | None = None,
        queued_at: float | None = None,
    ) -> PendingJob:
        """Add a job to its queue's pending list; the next cycle checks it can ever fit.

        `true_duration` is for simulations only (the sjf oracle orders by it); `queued_at` is when
        its wait began (None: its submit time).
        """
        if spec.id in self.jobs or spec.id in self.running:
            raise ValueError(f"job {spec.id} is already known")
        job = PendingJob(spec, attempts=attempts, attained=attained, true_duration=true_duration)
        if queued_at is not None:
            job.queued_at = queued_at
        self._enqueue(job)
        self.unchecked.append(job)
        return job

    def _enqueue(self, job: PendingJob) -> None:
        spec = job.spec
        queue = self.queue(spec.queue)
        estimator = self.estimator
        if estimator is not None:
            job.estimate = estimator.estimate(spec, seconds_run(job), history_keys(estimator, job))
        job.key = self.order_key(job)
        queue.pending[spec.id] = job
        insort(queue.pending_keys, job.key)
        if job.verdict_key < 0:
            if job.shape is None:
                job.shape = shape_of(spec)
            shape = (job.shape, spec.queue, spec.priority, spec.time_limit)
            job.verdict_key = self.intern((shape, spec.preemptible))
            job.family = self.intern((job.shape, spec.queue, spec.priority, spec.preemptible, "family"))
        queue.enter(job)
        job.join(queue.flagged)
        self.jobs[spec.id] = job
        if self.promote_after is not None and not job.promoted:
            heappush(self.promotions, (job.queued_at + self.promote_after, spec.seq, spec.id))

    def unqueue(self, queue: QueueState, job: PendingJob) -> None:
        """Take a job out of its queue's per-verdict order and flags (not out of `pending_keys`)."""
        keys = queue.by_verdict[job.verdict_key]
        i = bisect_left(keys, job.key)
        if i >= len(keys) or keys[i] != job.key:
            raise InvariantError(f"job {job.spec.id} missing from the order of queue {job.spec.queue}")
        del keys[i]
        if not keys:
            del queue.by_verdict[job.verdict_key]
        queue.leave_family(job)
        job.leave()

    def order_key(self, job: PendingJob) -> tuple[object, ...]:
        """Position in the queue: the policy's key, else priority, submit time, sequence, id."""
        if self.key_fn is not None:
            return self.key_fn(job)
        s = job.spec
        return (-s.priority, s.submit_time, s.seq, s.id)

    def set_order(self, key_fn: Callable[[PendingJob], tuple[object, ...]] | None) -> None:
        """Use a policy's job order (re-sorting the pending jobs if it changed)."""
        if key_fn != self.key_fn:
            self.key_fn = key_fn
            self.resort()

    def remove_pending(self, job_id: JobId) -> PendingJob:
        job = self.jobs.pop(job_id)
        queue = self.queues[job.spec.queue]
        del queue.pending[job_id]
        keys = queue.pending_keys
        i = bisect_left(keys, job.key)
        if i >= len(keys) or keys[i] != job.key:
            raise InvariantError(f"job {job_id} missing from the order of queue {job.spec.queue}")
        del keys[i]
        self.unqueue(queue, job)
        if job.nomination is not None:
            self.drop_nomination(job)
        return job

    def resort(self) -> None:
        """Recompute every pending job's order key (after the order policy changed)."""
        for queue in self.queues.values():
            queue.by_verdict, queue.by_family = {}, {}
            queue.parts.clear()
            for job in queue.pending.values():
                job.key = self.order_key(job)
                queue.by_verdict.setdefault(job.verdict_key, []).append(job.key)
                queue.by_family.setdefault(job.family, []).append(job.key)
            queue.pending_keys = sorted(j.key for j in queue.pending.values())
            for keys in queue.by_verdict.values():
                keys.sort()
            for keys in queue.by_family.values():
                keys.sort()
            queue.limits.cut(queue.by_family, queue.time_limit)

    # ---- attempts ----------------------------------------------------------------------
    def start(
        self, job: PendingJob, placement: list[tuple[int, int]], now: float, allocated: bool = False
    ) -> RunningAttempt:
        """Start the next attempt of a pending job on a placement (GPUs must be free).

        `allocated` says placement already took the GPUs (through the plan).
        """
        spec = job.spec
        exclusive = spec.launch is Launch.PER_NODE
        if not allocated:
            for node, mask in placement:
                self.take(node, mask, spec.cpus_per_replica, spec.memory_gib_per_replica, exclusive)
        queue = self.queues[spec.queue]
        self.add_queue_use(
            queue,
            spec.gpus,
            spec.cpus_per_replica * spec.replicas,
            spec.memory_gib_per_replica * spec.replicas,
        )
        limit_end = now + spec.time_limit if spec.time_limit is not None else NO_END
        attempt = RunningAttempt(
            job,
            job.attempts + 1,
            placement,
            now,
            limit_end,
            now,
            spec.cpus_per_replica,
            spec.memory_gib_per_replica,
            exclusive,
        )
        self._add_running(attempt)
        return attempt

    def end(self, job_id: JobId, requeue: bool, now: float) -> RunningAttempt:
        """An attempt ended (adapters call this between cycles); GPUs are released at once.

        With `requeue` the job returns to pending with its service so far; otherwise it is gone.
        """
        attempt = self.running.pop(job_id)
        self._new_id()
        self.occupancy.remove(attempt)
        self._drop_end_key(attempt)
        self._drop_estimate(attempt)
        spec = attempt.job.spec
        cpus, memory = spec.cpus_per_replica, spec.memory_gib_per_replica
        for node, mask in attempt.placement:
            self._hold_resources(node, mask, cpus, memory, attempt.exclusive, False)
        queue = self.queues[spec.queue]
        self._sub_queue_use(
            queue,
            spec.gpus,
            spec.cpus_per_replica * spec.replicas,
            spec.memory_gib_per_replica * spec.replicas,
        )
        if attempt.preempting_deadline is not None:
            queue.leaving_gpus -= spec.gpus
        job = attempt.job
        job.attempts = attempt.attempt
        job.attained += spec.gpus * max(0.0, now - attempt.start)
        if requeue:
            job.queued_at, job.promoted = now, False
            self._enqueue(job)
        elif self.estimator is not None:
            ran = seconds_run(job) if spec.gpus else now - attempt.start
            self.estimator.observe(spec, ran, history_keys(self.estimator, job))
        return attempt

    def mark_preempting(self, job_id: JobId, deadline: float, by: JobId | None) -> None:
        attempt = self.running[job_id]
        if attempt.preempting_deadline is None:
            self.queues[attempt.spec.queue].leaving_gpus += attempt.spec.gpus
            self.use_version += 1
            self.occupancy.stopping(attempt)
        self._drop_end_key(attempt)
        self._drop_estimate(attempt)  # it ends by its deadline
        attempt.preempting_deadline = deadline
        attempt.preempted_by = by
        self._new_id()
        self._start_seq += 1
        attempt.end_key = (attempt.expected_end, self._start_seq, job_id)
        self._add_end_key(attempt)

    # ---- nominations -------------------------------------------------------------------
    def nominate(
        self, job: PendingJob, placement: list[tuple[int, int]], victims: frozenset[JobId], now: float
    ) -> None:
        """Hold GPUs for a preemptor until its victims stop; counts toward its queue at once.
        A per-node job holds its nodes whole: it will start alone there."""
        if job.spec.launch is Launch.PER_NODE:
            held = [(node, (1 << self.specs[node].gpus) - 1) for node, _ in placement]
        else:
            held = list(placement)
        job.nomination = Nomination(placement, victims, now, held)
        for node, mask in held:
            self._set_held_raw(node, self.held[node] | mask)
        self.queues[job.spec.queue].incoming_gpus += job.spec.gpus
        self.use_version += 1

    def drop_nomination(self, job: PendingJob) -> None:
        nomination = job.nomination
        if nomination is None:
            return
        job.nomination = None
        for node, mask in nomination.held:
            self._set_held_raw(node, self.held[node] & ~mask)
        self.queues[job.spec.queue].incoming_gpus -= job.spec.gpus
        self.use_version += 1
