"""What the first job of each (shape, queue, class, time limit) blocked by capacity in a cycle was
told (`_Cycle.blocked`), found from a walk's capacity runs (`repeats.Walk`), which record their
jobs lazily: `FirstTold.first_blocked` finds the first run's job of the same verdict key (or of
the twin family that differs only by preemptibility) and remembers what it was told. A capacity
run's reason for each job is resolved when read (`FirstBlocked`). Lazy reasons refer to the
`FirstTold` only, never to the walk or the cycle (no garbage cycle per scheduling cycle).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Hashable

from corral.core.decisions import Reason
from corral.core.families import CAPACITY, Family, Key, blocked_key
from corral.core.jobs import PendingJob
from corral.core.model import JobId
from corral.core.reasons import PerLimit
from corral.core.state import ClusterState

TWINS_BY_FAMILY = True  # a job's twin families found by its family's id (False: by its shape; tests)
FAMILIES_KEPT = 1 << 16  # the caches forget the families' (shape, queue, class) ids at this many


class FirstTold:
    """The walk's families' capacity runs, as `first_blocked` reads them (kept past the walk)."""

    def __init__(
        self,
        blocked: dict[Hashable, Reason],
        state: ClusterState,
        jobs: dict[JobId, PendingJob],
        families: list[Family],
    ) -> None:
        self.blocked = blocked  # the cycle's: what each (shape, time limit) was first told so far
        self.state = state
        self.jobs = jobs
        self.families = families
        self.at: Key | None = None  # the walk's last job handed out
        self.done = False  # the walk is finished: every job was passed or looked at
        self.capacity_seen = False  # some family was passive as blocked by capacity
        self.bases: dict[int, list[Family]] | None = None  # per (shape, queue, class) id
        self.base_ids: dict[tuple[object, ...], int] = {}  # those ids (`Caches.base_ids`)
        self.twins_of: dict[int, list[Family]] = {}  # per family id (`PendingJob.family`): its twins

    def first_blocked(self, job: PendingJob, shape: Hashable) -> Reason | None:
        """What the first job of `job`'s (shape, queue, class, time limit) blocked by capacity in
        this cycle was told, so far (None: none was); found in the runs, then remembered."""
        blocked = self.blocked
        found = blocked.get(shape)
        if found is not None or not self.capacity_seen:
            return found  # (no family was passive as blocked by capacity: no run to look in)
        best: tuple[Key, Reason | PerLimit] | None = None
        preemptible = job.spec.preemptible
        for fam in self.twins(job):
            twin = fam.preemptible
            vk = job.verdict_key if twin == preemptible else self._twin_key(job, twin)
            keys = fam.queue.by_verdict.get(vk) if vk is not None else None
            hit = self._first_run(fam, keys) if keys else None
            if hit is not None and (best is None or hit[0] < best[0]):
                best = hit
        if best is None:
            return None
        told = best[1]
        found = told if isinstance(told, Reason) else told.resolve(job.spec.time_limit)
        blocked[shape] = found
        return found

    def _first_run(self, fam: Family, keys: list[Key]) -> tuple[Key, Reason | PerLimit] | None:
        """The first of `keys` (a verdict key's jobs, of `fam`, sorted) passed in one of its
        capacity runs (so far; the open run of a passive family counts)."""
        for lo, hi, reason in fam.runs:  # in order
            i = bisect_left(keys, lo)
            if i < len(keys) and keys[i] <= hi:
                return keys[i], reason
        verdict, at = fam.verdict, self.at
        if self.done or verdict is None or verdict.kind != CAPACITY or at is None or fam.pos >= len(fam.keys):
            return None
        i = bisect_left(keys, fam.keys[fam.pos])  # passed, not yet recorded: up to the last look
        if i >= len(keys) or keys[i] >= at:
            return None
        return keys[i], verdict.reason if verdict.per_limit is None else verdict.per_limit

    def twins(self, job: PendingJob) -> list[Family]:
        """The families of the walk whose jobs share `job`'s shape, queue and class (found by its
        family's id when its family is the walk's: no tuple of the shape to build and hash; each
        family's (shape, queue, class) is named by an id the state's caches keep across cycles)."""
        caches = self.state.caches
        if self.bases is None:
            self.bases = {}
            self.base_ids = caches.base_ids  # (these ids, even if the caches are replaced later)
            known = caches.family_bases
            if len(known) >= FAMILIES_KEPT:
                known.clear()
            for fam in self.families:
                entry = known.get(fam.family) if TWINS_BY_FAMILY else None
                if entry is None:
                    first = self.jobs[fam.keys[0][-1]]  # type: ignore[index]
                    spec = first.spec
                    base = caches.base_ids.setdefault(
                        (first.shape, spec.queue, spec.priority), len(caches.base_ids)
                    )
                    entry = known[fam.family] = (base, spec.preemptible)
                fam.base, fam.preemptible = entry
                self.bases.setdefault(fam.base, []).append(fam)
            for fam in self.families:
                self.twins_of[fam.family] = self.bases[fam.base]
        found = self.twins_of.get(job.family) if TWINS_BY_FAMILY else None
        if found is not None:
            return found
        base_id = self.base_ids.get((job.shape, job.spec.queue, job.spec.priority))
        return [] if base_id is None else self.bases.get(base_id, [])

    def _twin_key(self, job: PendingJob, preemptible: bool) -> int | None:
        """The verdict key of `job`'s (shape, time limit) with the other preemptibility, if any."""
        return self.state.interned((blocked_key(job), preemptible))

    def uniform(self, first: PendingJob, told: Reason | None, mixed: bool) -> Reason | None:
        """The one reason every capacity run of the families of `first`'s shape, queue and class
        gives, if the reasons its (shape, time limit)s were first told this cycle are all the same
        (`told`: one of them, None if none; `mixed`: they differ) and the same as the runs' (None:
        they differ, or name each job's own end)."""
        twins = self.twins(first)  # (read now: the families' bases, before the cycle removes the
        # jobs it started, which may empty a family that lazy reasons then read)
        if mixed:
            return None
        only: Reason | PerLimit | None = None
        for twin in twins:
            for _, _, reason in twin.runs:
                if only is None:
                    only = reason
                elif reason is not only and reason != only:
                    return None
        if told is not None:
            if only is None:
                only = told
            elif told is not only and told != only:
                return None
        return only if isinstance(only, Reason) else None


class FirstBlocked:
    """A capacity run's reason for one job, resolved when read: what its (shape, time limit) was
    first told (the run's own reason when the job has left meanwhile)."""

    __slots__ = ("reason", "told")

    def __init__(self, told: FirstTold, reason: Reason | PerLimit) -> None:
        self.told = told
        self.reason = reason

    def __call__(self, job_id: JobId) -> Reason:
        job = self.told.jobs.get(job_id)
        found = None if job is None else self.told.first_blocked(job, blocked_key(job))
        if found is not None:
            return found
        told = self.reason
        if isinstance(told, Reason):
            return told
        return told.reason if job is None else told.resolve(job.spec.time_limit)
