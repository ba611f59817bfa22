"""Which pending job a cycle looks at next: one global order (fifo, sjf, las), or queues by fair
share (default); a strict FIFO stops behind the first job that does not start.

With a walk (`repeats.Walk`) the jobs whose answer is already known are passed over; without
one (strict FIFO, very few jobs, very many families) every job is looked at in order, and a job
whose verdict key repeats an answer given at the same queues' use version gets it at once.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable
from typing import Protocol

from corral.core import repeats
from corral.core.decisions import CycleResult, Reason, Reasons, Why
from corral.core.families import Epoch, Key, Verdict, Verdicts, next_key
from corral.core.jobs import PartOf, PendingJob, QueueState
from corral.core.model import QueueName
from corral.core.plugins import Profile
from corral.core.state import ClusterState

ONE_JOB_SHORTCUT = True  # a cycle with one pending job considers it without ordering (tests turn it off)


class Looker(Protocol):
    """The cycle, as the order sees it: it looks at one job (`consider`) and judges families."""

    state: ClusterState
    profile: Profile
    now: float
    result: CycleResult
    reasons: Reasons
    verdicts: Verdicts
    blocked: dict[Hashable, Reason]
    walk_of: dict[QueueName, repeats.Walk]

    def consider(self, job: PendingJob) -> bool: ...

    def epoch(self) -> Epoch: ...

    def family_verdict(self, job: PendingJob, ahead: bool = False) -> Verdict | None: ...

    def tell(self, job: PendingJob, verdict: Verdict) -> None: ...

    def backfill_end(self) -> float | None: ...

    def family_part(self, job: PendingJob) -> int: ...

    def part_source(self) -> tuple[object, PartOf]: ...

    def queue_end(self, queue: QueueState, walk: repeats.Walk) -> None: ...


def run(cycle: Looker) -> None:
    """Look at the pending jobs in the profile's order."""
    jobs = cycle.state.jobs
    if len(jobs) == 1 and ONE_JOB_SHORTCUT:  # one pending job (the usual cycle): every order
        # reaches it first, and nothing repeats a verdict yet
        job = next(iter(jobs.values()))
        cycle.result.considered += 1
        _after(cycle, job, cycle.consider(job))
        return
    if cycle.profile.queue_order is None:
        _run_global(cycle)
    else:
        _run_fair(cycle)


def _repeats(cycle: Looker, job: PendingJob) -> bool:
    """A job of a shape already answered while no queue's count changed: give it that reason."""
    verdict = cycle.verdicts.get(job.verdict_key)
    if verdict is None or verdict[0] != cycle.state.use_version or job.is_flagged(cycle.now):
        return False
    cycle.result.reasons[job.spec.id] = verdict[1]
    return True


def _after(cycle: Looker, job: PendingJob, started: bool) -> bool:
    """Strict FIFO: False when the cycle stops behind a job that did not start."""
    reasons = cycle.result.reasons
    if started or not cycle.profile.head_of_line or job.spec.id not in reasons:
        return True
    if reasons[job.spec.id].code in (Why.HELD, Why.BACKOFF):
        return True
    cycle.result.others = Reason(
        Why.HEAD_OF_LINE, f"waiting behind job {job.spec.id} (strict FIFO: no job skips the head)"
    )
    return False


def _walk(cycle: Looker, queues: list[QueueState]) -> repeats.Walk | None:
    """A walk that passes over jobs whose answer is known (None: look at every job: a strict FIFO
    passes over none, and with very few jobs or very many families looking at each job costs
    less)."""
    if cycle.profile.head_of_line:
        return None
    if len(queues) == 1:
        jobs, shapes = len(queues[0].pending_keys), len(queues[0].by_family)
    else:
        jobs = sum(len(q.pending_keys) for q in queues)
        shapes = sum(len(q.by_family) for q in queues)
    if jobs <= repeats.FEW_JOBS or shapes > repeats.MANY_SHAPES:
        return None
    walk = repeats.Walk(queues, cycle, cycle.state.jobs)
    for q in queues:
        cycle.walk_of[q.spec.name] = walk
    return walk


def _run_global(cycle: Looker) -> None:
    """fifo, sjf, las: one order of every queue's pending jobs."""
    queues = [q for q in cycle.state.queues.values() if q.pending_keys]
    if not queues:
        return
    jobs, result = cycle.state.jobs, cycle.result
    walk = _walk(cycle, queues)
    if walk is None:  # one job at a time
        hol = cycle.profile.head_of_line
        lists = [q.pending_keys for q in queues]
        for key in lists[0] if len(lists) == 1 else heapq.merge(*lists):
            job = jobs[key[-1]]  # type: ignore[index]
            result.considered += 1
            if not hol and _repeats(cycle, job):
                continue
            if not _after(cycle, job, cycle.consider(job)):
                return
        return
    while (look := walk.next()) is not None:
        result.considered += 1
        cycle.consider(jobs[look[-1]])  # type: ignore[index]
    walk.finish()
    result.considered += walk.passed


def _run_fair(cycle: Looker) -> None:
    """default: queues by fair share (re-keyed after each change of the served queue's count).

    Nothing changes while a queue's jobs repeat an answer, so the queue keeps its turn.
    """
    order = cycle.profile.queue_order
    assert order is not None
    state, result = cycle.state, cycle.result
    heap: list[tuple[tuple[object, ...], int, QueueState]] = []
    cursors: dict[int, Key | None] = {}
    walks: dict[int, repeats.Walk | None] = {}
    for i, q in enumerate(state.queues.values()):
        if q.pending_keys:
            heap.append((order.key(q, state), i, q))
            cursors[i] = None
            walks[i] = _walk(cycle, [q])
    heapq.heapify(heap)
    while heap:
        _, i, q = heap[0]
        walk = walks[i]
        key = cursors[i] = next_key(q.pending_keys, cursors[i]) if walk is None else walk.next()
        if key is None:
            heapq.heappop(heap)  # nothing left in this queue
            if walk is not None:
                cycle.queue_end(q, walk)  # (what a new job of its families would be told)
                walk.finish()
                result.considered += walk.passed
            continue
        result.considered += 1
        job = q.pending[key[-1]]  # type: ignore[index]
        if walk is None and not cycle.profile.head_of_line and _repeats(cycle, job):
            continue
        before = q.effective_gpus
        if not _after(cycle, job, cycle.consider(job)):
            return
        if q.effective_gpus != before:
            heapq.heapreplace(heap, (order.key(q, state), i, q))
