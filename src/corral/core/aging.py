"""Promotion of long waits: an order that promotes a job once it has waited `promote_after`
seconds (e.g. `tiresias`' `starve`) gets it re-keyed then, at the first cycle at or after that
time, and the cycle wakes at the next promotion due.

The state keeps one heap entry per wait that may reach it (`ClusterState.promotions`, pushed as
jobs are queued); a cycle pops only the entries due, so a cycle costs nothing per waiting job.
An entry is stale when its job started, left, or was queued again since (its wait then began
later); stale entries are dropped as they come due.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from heapq import heappop, heappush

from corral.core.decisions import CycleResult
from corral.core.jobs import PendingJob
from corral.core.state import ClusterState


def promote(state: ClusterState, after: float | None, now: float, result: CycleResult) -> None:
    """Promote every pending job that has waited `after` seconds by `now` (None: the order
    promotes nobody); the cycle wakes when the next one is due."""
    if after != state.promote_after:
        _track(state, after)
    if after is None:
        return
    heap = state.promotions
    while heap and heap[0][0] <= now:
        when, _, job_id = heappop(heap)
        job = state.jobs.get(job_id)
        if job is None or job.promoted or job.queued_at + after != when:
            continue  # started or gone, already promoted, or queued again since: a later entry
        _rekey(state, job)
    if heap:
        result.wake_at(heap[0][0])


def _track(state: ClusterState, after: float | None) -> None:
    """The order's promotion time changed (a new policy): one entry per job still waiting."""
    state.promote_after = after
    state.promotions = []
    if after is None:
        return
    for job in state.jobs.values():
        if not job.promoted:
            heappush(state.promotions, (job.queued_at + after, job.spec.seq, job.spec.id))


def _rekey(state: ClusterState, job: PendingJob) -> None:
    """Move a waiting job to its promoted place in its queue's orders."""
    queue = state.queues[job.spec.queue]
    keys = queue.pending_keys
    del keys[bisect_left(keys, job.key)]
    state.unqueue(queue, job)
    job.promoted = True
    job.key = state.order_key(job)
    insort(keys, job.key)
    queue.enter(job)  # the per-verdict and per-family orders, and the family's parts (its level)
    job.join(queue.flagged)
