"""Walking pending jobs in order while passing over those that repeat an answer already given.

While no queue's counted GPUs change, admission and the blocked-shape cache answer every job of
one shape (`PendingJob.verdict_key`) alike (`cycle._Cycle.consider`), so a cycle needs to look
only at the first job of each shape after every change, and at flagged jobs (held, nominated,
backing off). Each queue keeps its pending jobs' order keys per shape (`QueueState.by_verdict`).
A `Walk` hands out, in order, only the jobs that need a look: the shapes without a current
verdict wait in a heap by their next job; a shape with one is passive, and its jobs get its
reason as one run (`Reasons.add_run`) when the walk passes a change or ends, without a Python
loop over them. A walk costs O(log shapes) per job looked at, plus O(shapes) per change.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right

from corral.core.decisions import Reason, Reasons
from corral.core.jobs import QueueState

Key = tuple[object, ...]
Verdicts = dict[int, tuple[int, Reason]]  # verdict key -> (queues' use version, reason)
MANY_SHAPES = 512  # above this many shapes in one walk, looking at each job costs less
FEW_JOBS = 8  # up to this many jobs in one walk, looking at each job costs less


class Walk:
    """The pending jobs of some queues, in their merged order (one queue: its own order)."""

    def __init__(self, queues: list[QueueState], now: float, verdicts: Verdicts, reasons: Reasons) -> None:
        self.verdicts = verdicts
        self.reasons = reasons
        if len(queues) == 1:
            by_verdict = queues[0].by_verdict
            self.shapes: list[int] = list(by_verdict)  # per group: its verdict key
            self.keys: list[list[Key]] = list(by_verdict.values())  # per group: its jobs' order keys
        else:
            self.shapes = [v for q in queues for v in q.by_verdict]
            self.keys = [k for q in queues for k in q.by_verdict.values()]
        self.flagged: list[tuple[Key, int]] = []
        if any(q.flagged for q in queues):
            group_of = {v: g for g, v in enumerate(self.shapes)}
            for queue in queues:
                for job in [j for j in queue.flagged if not j.is_flagged(now)]:
                    queue.flagged.discard(job)  # no longer held, nominated or backing off
                self.flagged.extend((j.key, group_of[j.verdict_key]) for j in queue.flagged)
            self.flagged.sort()
        self.next_flag = 0
        self.pos = [0] * len(self.keys)  # per group: its first job not yet looked at or given a run
        self.heap = [(keys[0], g) for g, keys in enumerate(self.keys)]  # groups without a verdict
        heapq.heapify(self.heap)
        self.passive: dict[int, Reason] = {}  # groups with a current verdict
        self.version: int | None = None
        self.at: Key | None = None  # the last job handed out
        self.passed = 0  # jobs given a run

    def next(self, version: int) -> Key | None:
        """The next job that needs a look (None: none left) at the queues' use `version`."""
        if version != self.version:
            self._cut()
            self.version = version
        heap, verdicts = self.heap, self.verdicts
        while heap:
            verdict = verdicts.get(self.shapes[heap[0][1]])
            if verdict is None or verdict[0] != version:
                break
            self.passive[heapq.heappop(heap)[1]] = verdict[1]
        flags, i = self.flagged, self.next_flag
        while i < len(flags) and self.at is not None and flags[i][0] <= self.at:
            i += 1
        self.next_flag = i
        if i < len(flags) and (not heap or flags[i][0] < heap[0][0]):
            stop, group = flags[i]
        elif heap:
            stop, group = heap[0]
        else:
            return None
        keys, lo = self.keys[group], self.pos[group]
        reason = self.passive.get(group)
        if reason is None:  # its group's next job: leaves the heap, the group comes back with its next
            heapq.heappop(heap)
            self.pos[group] = lo + 1
            if lo + 1 < len(keys):
                heapq.heappush(heap, (keys[lo + 1], group))
        else:  # a flagged job inside a passive group: the jobs before it repeat the verdict
            hi = bisect_left(keys, stop, lo)
            self._run(keys, lo, hi, reason)
            self.pos[group] = hi + 1
        self.at = stop
        return stop

    def finish(self) -> None:
        """Give the passive groups' remaining jobs their verdicts (the walk is over)."""
        add, pos, all_keys = self.reasons.add_run, self.pos, self.keys
        for group, reason in self.passive.items():
            keys, lo = all_keys[group], pos[group]
            if lo < len(keys):
                add(keys[lo:] if lo else keys.copy(), reason)
                self.passed += len(keys) - lo
        self.passive.clear()

    def _cut(self) -> None:
        """A queue's count changed: passive groups' jobs up to here keep the verdict, the rest wait."""
        at = self.at
        for group, reason in self.passive.items():
            keys, lo = self.keys[group], self.pos[group]
            hi = lo if at is None else bisect_right(keys, at, lo)
            self._run(keys, lo, hi, reason)
            self.pos[group] = hi
            if hi < len(keys):
                heapq.heappush(self.heap, (keys[hi], group))
        self.passive.clear()

    def _run(self, keys: list[Key], lo: int, hi: int, reason: Reason) -> None:
        if hi > lo:
            self.reasons.add_run(keys[lo:hi], reason)
            self.passed += hi - lo


def next_key(keys: list[Key], after: Key | None) -> Key | None:
    """The first key after `after` (None: none)."""
    i = 0 if after is None else bisect_right(keys, after)
    return keys[i] if i < len(keys) else None
