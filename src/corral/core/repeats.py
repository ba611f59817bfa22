"""Walking pending jobs in order while passing over those whose answer is already known.

A *family* is the pending jobs of one queue that differ at most by their time limits (same
shape, class and preemptibility: `PendingJob.family`). Between two changes that can alter an
answer (an *epoch*: a queue's counted GPUs, the cycle's reservations, or preemption being
deferred), every ordinary job of a family is told the same thing, except the jobs that a
backfill window could hold (`Judge.family_verdict` says what, without side effects):
- a family that admission keeps out (and whose queue has no victims to search) gets the reason
  as one run;
- a family that capacity keeps out (placement misses, as counts alone tell, no victim search
  would run, no reservation would be taken) passes over every job whose backfill attempt would
  change nothing: one whose time limit ends after the latest reservation start whose lifting,
  with every later one, changes what some node offers (`Judge.backfill_end`; such an attempt
  lifts nothing that matters, misses again and leaves no trace, not even in the index's order);
  the others stop the walk and are looked at, unless their (shape, time limit) was already
  blocked this cycle (then `consider` tries no backfill for them either).
A capacity sentence that names when each job would end (held behind another job's reservation:
`Why.BEHIND_RESERVATION`) is kept as a `PerLimit`: each passed job's own end is filled in when
its reason is read. When its victims' `min_runtime` protection ends depends on the job beyond
its family (`Victims.groups_by_family` false: las reads the attained service, tiresias the
level), a verdict holds for the jobs of one part (`Victims.family_part`, `Verdict.part`): a job
of another part stops the walk and, if looking changed nothing, gives the family its part's
verdict; as `consider` repeats a verdict key's first answer whatever its part, an admission run
of one part tells each job its key's answer if it has one, else records the run's for its key
(`families.tell_per_key`). A family is looked at job by job instead while that time is earlier
than the cycle's `next_wake` so far (looking would move it).
A family whose only verdict key repeats an answer (`consider` would repeat it) is passive too,
found at a look (`_settle`) or at the first job passed as repeating it (`_repeats`: e.g. the look
at its first job took a reservation, which changed the epoch). A job blocked by capacity is
told what the first job of its (shape, queue, class, time limit)
blocked in this cycle was told (`_Cycle.blocked`), which a run records lazily: `first_told`
finds it from the runs. Flagged jobs (held, nominated, backing off, kept off nodes) always stop
the walk. A walk looks at O(families) jobs per epoch plus the jobs that could start, and costs
O(log) per job looked at; what looking at each job in order would decide, it decides
(tests/core/test_repeats.py).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right

from corral.core.decisions import Reason
from corral.core.families import (
    CAPACITY,
    REPEAT,
    Epoch,
    Family,
    Judge,
    Key,
    Verdict,
    blocked_key,
    tell_per_key,
)
from corral.core.first_told import FirstBlocked, FirstTold
from corral.core.jobs import PendingJob, QueueState
from corral.core.model import JobId

MANY_SHAPES = 512  # above this many families in one walk, looking at each job costs less
FEW_JOBS = 8  # up to this many jobs in one walk, looking at each job costs less
AHEAD = True  # a family's verdict known before its first look spares the look (tests turn it off)
# capacity runs whose jobs are all told one reason get it at once (`FirstTold.uniform`); False: every
# run resolved job by job when read (the long way, for tests)
UNIFORM_RUNS = True


class Walk:
    """The pending jobs of some queues, in their merged order (one queue: its own order)."""

    def __init__(self, queues: list[QueueState], judge: Judge, jobs: dict[JobId, PendingJob]) -> None:
        self._judge: Judge | None = judge  # (let go of when the walk is over: `finish`)
        self.state = judge.state
        self.jobs = jobs
        self.now = now = judge.now
        self.families: list[Family] = []
        self.by_id: dict[int, Family] = {}
        by_id = self.by_id
        for queue in queues:
            for family, keys in queue.by_family.items():
                by_id[family] = fam = Family(len(self.families), keys, queue, family)
                self.families.append(fam)
        for queue in queues:
            if queue.flagged:
                for job in [j for j in queue.flagged if not j.is_flagged(now)]:
                    queue.flagged.discard(job)  # no longer held, nominated, backing off or kept off nodes
                for job in queue.flagged:
                    by_id[job.family].flags.append(job.key)
        for fam in self.families:
            fam.flags.sort()
        self.heap = [(fam.keys[0], fam.index, 0) for fam in self.families]
        heapq.heapify(self.heap)
        self.passive: list[Family] = []
        self.epoch: Epoch | None = None
        self.last: tuple[Family, PendingJob] | None = None  # the last job handed out, and its family
        self.passed = 0  # jobs passed over (given a reason without a look)
        # what each (shape, time limit) was first told, from the runs; its `at` is the last job
        # handed out, and it is what lazy reasons refer to (kept past the walk)
        self.told = FirstTold(judge.blocked, self.state, jobs, self.families)

    @property
    def judge(self) -> Judge:
        """The cycle, while the walk goes on."""
        judge = self._judge
        assert judge is not None, "the walk is over"
        return judge

    # ---- the walk ------------------------------------------------------------------------
    def next(self) -> Key | None:
        """The next job that needs a look (None: none left)."""
        epoch = self.judge.epoch()
        last, self.last = self.last, None
        if epoch != self.epoch:
            self._cut()
            self.epoch = epoch
            if last is not None:
                self._push(last[0])
        elif last is not None:
            self._settle(*last)
        heap, jobs, verdicts, version = self.heap, self.jobs, self.judge.verdicts, epoch[0]
        while heap:
            key, i, token = heapq.heappop(heap)
            fam = self.families[i]
            if token != fam.token:
                continue
            job = jobs[key[-1]]  # type: ignore[index]
            if fam.verdict is not None:  # a job inside a passive family that needs a look
                hi = bisect_left(fam.keys, key, fam.pos)
                self._run(fam, fam.pos, hi)
                fam.pos = hi + 1
            else:
                verdict = verdicts.get(job.verdict_key)
                fam.pos += 1
                if verdict is not None and verdict[0] == version and not job.is_flagged(self.now):
                    self.judge.reasons[job.spec.id] = verdict[1]  # as `consider` would: it repeats
                    self.passed += 1
                    self._repeats(fam, job, verdict[1])
                    self._push(fam)
                    continue
                if AHEAD and self._ahead(fam, job, key):
                    continue
            self.told.at = key
            self.last = (fam, job)
            return key
        return None

    def finish(self) -> None:
        """Give the passive families' remaining jobs their verdicts, and every job passed as blocked
        by capacity its reason (the walk is over); unless no one reads them
        (`ClusterState.runs_read`): listing them costs what waits, not what can change."""
        self._cut(everything=True)
        if not self.state.runs_read:  # no one reads them: the jobs passed are not listed
            self.told.done = True
            self._judge = None
            return
        reasons = self.judge.reasons
        told_of = self.told
        # per (shape, queue, class): the first reason its (shape, time limit)s were told this
        # cycle, and the bases told more than one (compared, not hashed: there may be many)
        first_of: dict[tuple[object, ...], Reason] = {}
        mixed: set[tuple[object, ...]] = set()
        if any(fam.runs for fam in self.families):
            for shape, reason in told_of.blocked.items():
                if isinstance(shape, tuple):
                    base = shape[:3]
                    seen = first_of.setdefault(base, reason)
                    if seen is not reason and base not in mixed and seen != reason:
                        mixed.add(base)
        uniform_of: dict[tuple[object, ...], Reason | None] = {}  # per (shape, queue, class)
        for fam in self.families:
            if not fam.runs:
                continue
            first = self.jobs[fam.keys[0][-1]]  # type: ignore[index]
            base = (first.shape, first.spec.queue, first.spec.priority)
            if base in uniform_of:
                uniform = uniform_of[base]
            else:
                uniform = uniform_of[base] = told_of.uniform(first, first_of.get(base), base in mixed)
            if not UNIFORM_RUNS:
                uniform = None  # (the long way: each job's reason resolved when read)
            for (lo, hi), (_, _, told) in zip(fam.spans, fam.runs, strict=True):
                keys = fam.keys[lo:hi]  # (the keys do not change during a cycle)
                if uniform is not None:
                    reasons.add_run(keys, uniform)
                else:  # resolved when read (the simulator never reads them)
                    reasons.add_lazy_run(keys, FirstBlocked(told_of, told))
        told_of.done = True
        # the cycle holds the result that holds those runs: without this, each cycle's objects
        # would form a reference cycle, left to the cyclic collector (on `overload128`, 2.3 M
        # objects and a third of the replay's CPU)
        self._judge = None

    def _cut(self, everything: bool = False) -> None:
        """The epoch changed (or the walk ended): passive families' jobs up to the last job handed
        out keep their verdicts; the rest wait for a look."""
        at = self.told.at
        for fam in self.passive:
            if everything:
                hi = len(fam.keys)
            else:
                hi = fam.pos if at is None else bisect_right(fam.keys, at, fam.pos)
            self._run(fam, fam.pos, hi)
            fam.pos = hi
            fam.verdict = None
            if not everything:
                self._push(fam)
        self.passive = []

    def _ahead(self, fam: Family, job: PendingJob, key: Key) -> bool:
        """A job about to be handed out for a look whose family's verdict is known already
        (`Judge.family_verdict`: looking at it would tell it that and change nothing) and that no
        backfill window could hold: told what the look would tell it, with the cycle's memory
        of it (`Judge.tell`), and its family settled as after that look; True if so."""
        if job.is_flagged(self.now):
            return False
        judge = self.judge
        verdict = judge.family_verdict(job, ahead=True)
        if verdict is None:
            return False
        if verdict.kind == CAPACITY:
            limit = job.spec.time_limit
            end = None if limit is None else judge.backfill_end()
            if (
                limit is not None
                and end is not None
                and self.now + limit <= end
                and self.told.first_blocked(job, blocked_key(job)) is None
            ):
                return False  # its backfill attempt may start it: a look
        self.told.at = key  # (as if handed out: the jobs passed before it count as passed)
        judge.tell(job, verdict)
        self.passed += 1
        self._settle(fam, job, verdict)
        return True

    def _settle(self, fam: Family, job: PendingJob, known: Verdict | None = None) -> None:
        """A look changed nothing: the family may now have a verdict for the rest of the epoch
        (`known`: `Judge.family_verdict(job)`, asked already)."""
        if fam.verdict is None:
            verdict = None
            if len(fam.queue.by_verdict.get(job.verdict_key, ())) == len(fam.keys):
                found = self.judge.verdicts.get(job.verdict_key)
                if found is not None and self.epoch is not None and found[0] == self.epoch[0]:
                    verdict = Verdict(REPEAT, found[1])  # its only verdict key repeats an answer
            if verdict is None:
                verdict = known if known is not None else self.judge.family_verdict(job)
            if verdict is not None:
                fam.verdict = verdict
                self.passive.append(fam)
                if verdict.kind == CAPACITY:
                    self.told.capacity_seen = True
        elif fam.verdict.part is not None and self.judge.family_part(job) != fam.verdict.part:
            # a stop of another part: that part's jobs are told what it was, from here on (a
            # job is told what the first of its verdict key was, whatever its part, as `consider`
            # repeats it: a capacity run's reasons are resolved per key, `first_blocked`; an
            # admission run's, told at once, `tell_per_key`)
            verdict = self.judge.family_verdict(job)
            if verdict is None or verdict.kind != fam.verdict.kind:
                self.passive.remove(fam)
                verdict = None
            fam.verdict = verdict
        self._push(fam)

    def _repeats(self, fam: Family, job: PendingJob, reason: Reason) -> None:
        """A job passed as repeating its verdict key's current answer: when that key is its
        family's only one, every other job of the family repeats it too, up to the epoch's end
        (as `_settle` finds after a look; here no look came first, e.g. the epoch changed right
        after the family's first job was looked at, as a reservation does)."""
        if len(fam.queue.by_verdict.get(job.verdict_key, ())) == len(fam.keys):
            fam.verdict = Verdict(REPEAT, reason)
            self.passive.append(fam)

    def _push(self, fam: Family) -> None:
        """Put the family's next job that needs a look on the heap (if any)."""
        fam.token += 1
        if fam.verdict is None:
            key = fam.keys[fam.pos] if fam.pos < len(fam.keys) else None
        else:
            key = self._next_stop(fam)
        if key is not None:
            heapq.heappush(self.heap, (key, fam.index, fam.token))

    def _run(self, fam: Family, lo: int, hi: int) -> None:
        if hi <= lo:
            return
        verdict = fam.verdict
        assert verdict is not None
        if verdict.kind == CAPACITY:
            told = verdict.reason if verdict.per_limit is None else verdict.per_limit
            fam.runs.append((fam.keys[lo], fam.keys[hi - 1], told))
            fam.spans.append((lo, hi))
        elif verdict.part is not None:  # admission, of one part: per verdict key (at its epoch)
            assert self.epoch is not None
            reasons = self.judge.reasons if self.state.runs_read else None
            tell_per_key(
                fam.keys, lo, hi, verdict.reason, self.epoch[0], self.jobs, self.judge.verdicts, reasons
            )
        elif self.state.runs_read:
            self.judge.reasons.add_run(fam.keys[lo:hi], verdict.reason)
        self.passed += hi - lo

    # ---- stops inside a passive family ---------------------------------------------------
    def _next_stop(self, fam: Family) -> Key | None:
        """Its next flagged job, or job that a backfill window could hold (None: none)."""
        keys, verdict = fam.keys, fam.verdict
        assert verdict is not None
        if fam.pos >= len(keys):
            return None
        best: Key | None = None
        if fam.flags:
            i = bisect_left(fam.flags, keys[fam.pos])
            if i < len(fam.flags):
                best = fam.flags[i]
        if verdict.part is not None:
            i = self._part_stop(fam, verdict.part)
            if i < len(keys) and (best is None or keys[i] < best):
                best = keys[i]
        if verdict.kind == CAPACITY:
            end = self.judge.backfill_end()
            if end is not None:
                i = self._scan(fam, end)
                if i < len(keys) and (best is None or keys[i] < best):
                    best = keys[i]
        return best

    def _part_stop(self, fam: Family, part: int) -> int:
        """The first job from `fam.pos` on whose part is not `part` (the queue's `FamilyParts`,
        kept across cycles)."""
        parts = fam.queue.parts
        parts.use(*self.judge.part_source())
        return parts.stop(fam.family, fam.keys, self.jobs, fam.pos, part)

    def _scan(self, fam: Family, end: float) -> int:
        """The first job from `fam.pos` on that may backfill by `end`: a time limit that ends by
        then, and a (shape, time limit) not yet blocked in this cycle (the queue's
        `limits.FamilyLimits`, kept across cycles, passes over blocks of jobs whose limits end
        too late)."""
        i = fam.scan_pos if end <= fam.scan_end and fam.scan_pos >= fam.pos else fam.pos
        queue = fam.queue
        i = queue.limits.first(
            fam.family, fam.keys, queue.time_limit, i, self.now, end, fam.down, self._unblocked
        )
        fam.scan_pos, fam.scan_end = i, end
        return i

    def _unblocked(self, key: Key) -> bool:
        """A job with a time limit whose (shape, time limit) was not yet blocked in this cycle (in
        a family, the limit alone decides, and stays blocked: `Family.down` remembers it)."""
        job = self.jobs[key[-1]]  # type: ignore[index]
        limit = job.spec.time_limit
        if limit is None:
            return False
        if self.told.first_blocked(job, blocked_key(job)) is None:
            return True
        self.by_id[job.family].down.add(limit)
        return False
