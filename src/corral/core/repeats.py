"""Passing over runs of pending jobs that repeat an answer the cycle already gave.

While no queue's counted GPUs change, admission and the blocked-shape cache answer every job of
one shape (`PendingJob.verdict_key`) alike (`cycle._Cycle.consider`), so a cycle needs to look
only at the first job of each shape and at flagged jobs (held, nominated, backing off). Each
queue keeps its pending jobs' order keys per shape (`QueueState.by_verdict`); `skip` finds the
next job that needs a look by bisection and gives every job before it its shape's reason as
one run (`Reasons.add_run`), without a Python loop over them.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable

from corral.core.decisions import Reason, Reasons
from corral.core.jobs import QueueState

Key = tuple[object, ...]
Verdicts = dict[int, tuple[int, Reason]]  # verdict key -> (queues' use version, reason)
MANY_SHAPES = 64  # above this many shapes in the order, looking at each job costs less


def skip(
    groups: Iterable[tuple[int, list[Key]]],
    flagged: list[Key],
    after: Key | None,
    verdicts: Verdicts,
    version: int,
    reasons: Reasons,
) -> tuple[Key | None, int]:
    """Give the jobs after `after` that repeat a current verdict their reasons, up to the first
    job that needs a look; return its key (None: no job left) and how many were passed over.

    `groups` are the order keys per verdict key (sorted); `flagged` the sorted keys of the jobs
    that always need a look.
    """
    stop: Key | None = None
    runs: list[tuple[list[Key], int, Reason]] = []
    for verdict_key, keys in groups:
        lo = 0 if after is None else bisect_right(keys, after)
        if lo >= len(keys):
            continue
        verdict = verdicts.get(verdict_key)
        if verdict is not None and verdict[0] == version:
            runs.append((keys, lo, verdict[1]))
        elif stop is None or keys[lo] < stop:
            stop = keys[lo]
    lo = 0 if after is None else bisect_right(flagged, after)
    if lo < len(flagged) and (stop is None or flagged[lo] < stop):
        stop = flagged[lo]
    passed = 0
    for keys, lo, reason in runs:
        hi = len(keys) if stop is None else bisect_left(keys, stop, lo)
        if hi > lo:
            reasons.add_run(keys[lo:hi], reason)
            passed += hi - lo
    return stop, passed


def flagged_keys(queues: Iterable[QueueState], now: float) -> list[Key]:
    """The sorted order keys of the jobs that need a look whatever their shape; jobs no longer
    held, nominated or backing off leave the flagged sets."""
    found: list[Key] = []
    for queue in queues:
        for job in [j for j in queue.flagged if not j.is_flagged(now)]:
            queue.flagged.discard(job)
        found.extend(j.key for j in queue.flagged)
    found.sort()
    return found


def next_key(keys: list[Key], after: Key | None) -> Key | None:
    """The first key after `after` (None: none)."""
    i = 0 if after is None else bisect_right(keys, after)
    return keys[i] if i < len(keys) else None
