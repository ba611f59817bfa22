"""What a walk (`repeats.Walk`) knows of the families of pending jobs: their verdicts for one
epoch (`Verdict`), each family's place in the walk (`Family`), and what the walk asks its cycle
(`Judge`). See `repeats` for what a family and an epoch are.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Hashable
from typing import Protocol

from corral.core.decisions import Reason, Reasons
from corral.core.jobs import PartOf, PendingJob, QueueState
from corral.core.model import JobId
from corral.core.reasons import PerLimit
from corral.core.state import ClusterState

Key = tuple[object, ...]
Verdicts = dict[int, tuple[int, Reason]]  # verdict key -> (queues' use version, reason)
Epoch = tuple[int, int, bool]  # (queues' use version, reservations made or moved, preemption deferred)
ADMISSION, CAPACITY, REPEAT = 0, 1, 2


class Verdict:
    """What every ordinary job of a family is told during one epoch (see the module). (A class
    written out, not a dataclass with slots: the compiled core builds it natively.)"""

    __slots__ = ("kind", "part", "per_limit", "reason")

    def __init__(
        self, kind: int, reason: Reason, per_limit: PerLimit | None = None, part: int | None = None
    ) -> None:
        self.kind = kind  # ADMISSION, CAPACITY, or REPEAT (one verdict key only: its current verdict)
        self.reason = reason
        # CAPACITY only: `reason` names the end of the job looked at
        self.per_limit: PerLimit | None = per_limit
        # told only to the jobs whose `Judge.family_part` is this (None: to all); ADMISSION: each
        # verdict key repeats the first answer it was given at the version (`tell_per_key`)
        self.part: int | None = part


class Judge(Protocol):
    """What a walk needs from its cycle."""

    now: float
    state: ClusterState
    reasons: Reasons
    verdicts: Verdicts
    blocked: dict[Hashable, Reason]

    def epoch(self) -> Epoch: ...

    def family_verdict(self, job: PendingJob, ahead: bool = False) -> Verdict | None:
        """What an ordinary job of `job`'s family that repeats no verdict would be told now, if
        that is the same for all of them (None: they must be looked at)."""
        ...

    def tell(self, job: PendingJob, verdict: Verdict) -> None:
        """Tell `job` what `consider` would, `verdict` being its `family_verdict` just now (and
        it no job a backfill window could hold), with what the cycle remembers of that look."""
        ...

    def backfill_end(self) -> float | None:
        """The latest time by which a job must end for its backfill attempt to change anything."""
        ...

    def family_part(self, job: PendingJob) -> int:
        """What its answer depends on beyond its family (`Verdict.part`)."""
        ...

    def part_source(self) -> tuple[object, PartOf]:
        """Who says a job's part (compared by identity), and how (`jobs.FamilyParts.use`)."""
        ...


class Family:
    __slots__ = (
        "base",
        "down",
        "family",
        "flags",
        "index",
        "keys",
        "pos",
        "preemptible",
        "queue",
        "runs",
        "scan_end",
        "scan_pos",
        "spans",
        "token",
        "verdict",
    )

    def __init__(self, index: int, keys: list[Key], queue: QueueState, family: int = -1) -> None:
        self.index = index
        self.family = family  # its id (`PendingJob.family`)
        self.keys = keys  # the family's order keys (its queue's list: unchanged during a cycle)
        self.queue = queue
        self.pos = 0  # its first job not yet passed or handed out
        self.token = 0  # its entry in the heap, if any, carries the current token
        self.verdict: Verdict | None = None  # passive while it has one (for the current epoch)
        self.flags: list[Key] = []  # its flagged jobs' keys, sorted
        # the runs it passed as blocked by capacity: (first key, last key, reason), in order
        self.runs: list[tuple[Key, Key, Reason | PerLimit]] = []
        self.spans: list[tuple[int, int]] = []  # ... and where each is in `keys` (start, end)
        self.scan_pos = 0  # the jobs from `pos` to here cannot backfill by `scan_end`
        self.scan_end = -1.0
        self.down: set[float] = set()  # time limits of its jobs found blocked in this cycle
        self.base = -1  # the id of (shape, queue, class) of its jobs (`Caches.base_ids`)
        self.preemptible = True  # ... and their preemptibility (both set by `Walk._twins`)


def tell_per_key(
    keys: list[Key],
    lo: int,
    hi: int,
    reason: Reason,
    version: int,
    jobs: dict[JobId, PendingJob],
    verdicts: Verdicts,
    reasons: Reasons | None,
) -> None:
    """A run `keys[lo:hi]` of a family kept out by admission with a verdict of one part: each job
    is told what `consider` would tell it, its verdict key's answer at the queues' use `version`
    if it has one (a job of another part was told it first: `consider` repeats it), else `reason`,
    which its key then records. `reasons` (None: no one reads them) lists them as runs of one
    reason each."""
    start, current = lo, reason
    for i in range(lo, hi):
        job = jobs[keys[i][-1]]  # type: ignore[index]
        key = job.verdict_key
        found = verdicts.get(key)
        if found is None or found[0] != version:
            verdicts[key] = (version, reason)
            told = reason
        else:
            told = found[1]
        if told is not current and reasons is not None:
            if i > start:
                reasons.add_run(keys[start:i], current)
            start, current = i, told
    if reasons is not None:
        reasons.add_run(keys[start:hi], current)


def blocked_key(job: PendingJob) -> tuple[object, ...]:
    """The key of `_Cycle.blocked`: (shape, queue, class, time limit)."""
    spec = job.spec
    return (job.shape, spec.queue, spec.priority, spec.time_limit)


def next_key(keys: list[Key], after: Key | None) -> Key | None:
    """The first key after `after` (None: none)."""
    i = 0 if after is None else bisect_right(keys, after)
    return keys[i] if i < len(keys) else None
