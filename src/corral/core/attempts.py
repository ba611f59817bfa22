"""Running attempts and the order of their ends: time limits or preemption deadlines (`by_end`)
and, while reservation searches use them, estimated ends of the attempts without a time limit
(`by_estimate`, from `estimates`: never limits).

`ClusterState` (`state.py`) adds queues and pending jobs; starting and ending attempts (which
change queues' use) are there, the bookkeeping of the attempts themselves here.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Sequence

from corral.core.errors import InvariantError
from corral.core.estimates import Chain, Estimator
from corral.core.jobs import NO_END, PendingJob, RunningAttempt
from corral.core.model import JobId
from corral.core.nodes import NodeTable


class AttemptTable(NodeTable):
    """The running attempts of a `ClusterState` and their ends, changed only through `plan` (or by
    adapters between cycles)."""

    def __init__(self, levels: Sequence[str] = ()) -> None:
        super().__init__(levels)
        self.running: dict[JobId, RunningAttempt] = {}
        self.by_end: list[tuple[float, int, JobId]] = []
        # run times learned from finished jobs (None: no estimates); the estimated ends of the
        # attempts without a time limit, sorted (`RunningAttempt.estimate_key`), kept only while
        # reservation searches use them (`estimating`: since `want_estimates`, until unused a while)
        self.estimator: Estimator | None = None
        self.by_estimate: list[tuple[float, int, JobId]] = []
        self.estimating = False
        self.estimates_used_at = 0.0
        self._start_seq = 0
        self.min_runtime_by_value: dict[int, float] = {}  # per priority value (`ClusterState` fills it)
        # per node, the `by_end` keys of the attempts that hold GPUs of it or the whole node, sorted
        # (a key once per replica there); and (end, seq, job, node) of every node's last key,
        # sorted: the order in which nodes are wholly released as attempts end
        # (`first_release.WholeNodes`)
        self.node_ends: dict[int, list[tuple[float, int, JobId]]] = {}
        self.last_ends: list[tuple[float, int, JobId, int]] = []
        # per node of `node_ends`: the GPUs its attempts there hold, and how many hold it whole
        self.node_freed: dict[int, tuple[int, int]] = {}

    def _add_running(self, attempt: RunningAttempt) -> None:
        job_id = attempt.job.spec.id
        if job_id in self.running:
            raise InvariantError(f"job {job_id} already has a live attempt")
        self.running[job_id] = attempt
        self.occupancy.add(attempt, self.min_runtime(attempt))
        self._start_seq += 1
        attempt.end_key = (attempt.expected_end, self._start_seq, job_id)
        self._add_end_key(attempt)
        if self.estimating and attempt.limit_end == NO_END:
            self._estimate_end(attempt, attempt.start)
        before = self.base_id
        self._new_id()
        self.plan.record(self._undo_running, job_id, before, self.base_id)

    def _undo_running(self, job_id: JobId, before: int, after: int) -> None:
        same = self.base_id == after  # as `_undo_hold`
        self._remove_running_raw(job_id)
        if same:
            self.base_id = before

    def _remove_running_raw(self, job_id: JobId) -> RunningAttempt:
        self._new_id()
        attempt = self.running.pop(job_id)
        self.occupancy.remove(attempt)
        self._drop_end_key(attempt)
        self._drop_estimate(attempt)
        return attempt

    def _drop_end_key(self, attempt: RunningAttempt) -> None:
        key = attempt.end_key
        i = bisect_left(self.by_end, key) if key is not None else len(self.by_end)
        if key is None or i >= len(self.by_end) or self.by_end[i] != key:
            raise InvariantError(f"attempt of {attempt.spec.id} missing from the end-time order")
        del self.by_end[i]
        self._index_end(attempt, key, False)

    def _add_end_key(self, attempt: RunningAttempt) -> None:
        """Enter an attempt's `end_key` in `by_end` (and its nodes' ends)."""
        key = attempt.end_key
        assert key is not None
        insort(self.by_end, key)
        self._index_end(attempt, key, True)

    def _index_end(self, attempt: RunningAttempt, key: tuple[float, int, JobId], add: bool) -> None:
        """Add or remove an end key in the ends of the attempt's nodes (`node_ends`, `last_ends`)."""
        node_ends, last_ends, node_freed = self.node_ends, self.last_ends, self.node_freed
        exclusive, log = attempt.exclusive, self.node_log
        for node, mask in attempt.placement:
            if not mask and not exclusive:
                continue  # (nothing of the node's that it frees)
            log.append(node)  # (`fit_reads`: its last end or what its attempts free may change)
            masks, whole = node_freed.get(node, (0, 0))  # (attempts' masks are disjoint)
            if add:
                node_freed[node] = (masks | mask, whole + exclusive)
            else:
                node_freed[node] = (masks & ~mask, whole - exclusive)
            keys = node_ends.get(node)
            if keys is None:
                if not add:
                    raise InvariantError(f"attempt of {attempt.spec.id} missing from its nodes' ends")
                node_ends[node] = [key]
                insort(last_ends, (key[0], key[1], key[2], node))
                continue
            old = keys[-1]
            if add:
                insort(keys, key)
            else:
                i = bisect_left(keys, key)
                if i >= len(keys) or keys[i] != key:
                    raise InvariantError(f"attempt of {attempt.spec.id} missing from its nodes' ends")
                del keys[i]
            if keys and keys[-1] == old:
                continue  # the node's last end stands
            del last_ends[bisect_left(last_ends, (old[0], old[1], old[2], node))]
            if keys:
                new = keys[-1]
                insort(last_ends, (new[0], new[1], new[2], node))
            else:
                del node_ends[node]
                del node_freed[node]

    def record_checkpoint(self, job_id: JobId, when: float) -> None:
        attempt = self.running[job_id]
        before = attempt.last_checkpoint
        attempt.last_checkpoint = when
        self.occupancy.checkpointed(attempt, before)

    # ---- estimated ends (`estimates`: never limits) --------------------------------------
    def _estimate_end(self, attempt: RunningAttempt, now: float) -> None:
        """Estimate when an attempt without a time limit ends, given the time it has run by `now`."""
        assert self.estimator is not None
        before = seconds_run(attempt.job)  # earlier attempts
        estimator = self.estimator
        chain = history_keys(estimator, attempt.job)
        found = estimator.estimate(attempt.spec, before + now - attempt.start, chain)
        if found is None:
            return
        attempt.estimate = found
        attempt.estimated_end = attempt.start + max(found.seconds - before, now - attempt.start + 1.0)
        self._start_seq += 1
        attempt.estimate_key = (attempt.estimated_end, -self._start_seq, attempt.spec.id)
        insort(self.by_estimate, attempt.estimate_key)

    def _drop_estimate(self, attempt: RunningAttempt) -> None:
        key = attempt.estimate_key
        if key is not None:
            attempt.estimate_key = None
            del self.by_estimate[bisect_left(self.by_estimate, key)]

    def want_estimates(self, now: float) -> bool:
        """Whether running attempts have estimated ends (a search on them may be worth it): kept
        from the first call on, estimating every running attempt without a time limit then."""
        self.estimates_used_at = now
        if not self.estimating and self.estimator is not None:
            self.estimating = True
            for attempt in self.running.values():
                if attempt.limit_end == NO_END and attempt.preempting_deadline is None:
                    self._estimate_end(attempt, now)
        return bool(self.by_estimate)

    def forget_estimates(self) -> None:
        """Stop keeping estimated ends (no search used them for a while; `want_estimates`)."""
        for _, _, job_id in self.by_estimate:
            self.running[job_id].estimate_key = None
        self.by_estimate.clear()
        self.estimating = False

    def refresh_estimates(self, now: float) -> None:
        """Attempts running past their estimated end get a later one (from the run times longer
        than theirs so far); each estimate at least doubles, so this costs little over a run."""
        while self.by_estimate and self.by_estimate[0][0] <= now:
            attempt = self.running[self.by_estimate[0][2]]
            self._drop_estimate(attempt)
            self._estimate_end(attempt, now)

    def min_runtime(self, attempt: RunningAttempt) -> float:
        """Seconds after its start during which an attempt is never preempted (DESIGN.md 6.3).

        Its class's `min_runtime`, doubled for every earlier attempt of the job (up to 64 times),
        so that no job is preempted over and over just after each restart.
        """
        earlier = min(attempt.attempt - 1, 6)
        return self.min_runtime_by_value.get(attempt.job.spec.priority, 0.0) * (1 << earlier)


def history_keys(estimator: Estimator, job: PendingJob) -> Chain:
    """The job's history keys (`Estimator.chain`), resolved once."""
    chain = job.history_keys
    if chain is None:
        chain = job.history_keys = estimator.chain(job.spec)
    return chain


def seconds_run(job: PendingJob) -> float:
    """Seconds its earlier attempts ran (GPU-seconds attained over its GPUs)."""
    gpus = job.spec.gpus
    return job.attained / gpus if gpus else 0.0
