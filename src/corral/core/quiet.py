"""Cycles that arrivals alone cannot change: what a cycle that decided nothing leaves (`leave`),
and the answer of the next cycle told without running it (`skip`), for the simulator.

A cycle that started, preempted, nominated, promoted and rejected nothing, reached every job and
deferred no victim search leaves a `Quiet`: the verdicts it memorised per verdict key
(`_Cycle.verdicts`: what every later job of that (shape, queue, class, time limit, preemptible)
is told at once, without a look, while no queue's counted GPUs change), per queue the verdicts
of its families at the queue's end (`QueueEnd`: what the walk tells every ordinary job of a
family that no backfill window may hold, `repeats.Walk.passive`) with the backfill window then,
the queues' fair-share order, and a mark of the state. Until anything but arrivals changes the
state (the simulator runs a cycle after every end, stop, node change and wake, and after a
checkpoint that may make a victim), a cycle at a later instant decides what that one did:
nothing that blocked a job can have moved but the time, and what moves with the time is bounded
by the cycle's `next_wake` (backoffs, protections, reservations) or only shrinks (a backfill
window); the sentences that name when a job would end are written again for the new instant
(`at_time`); where someone reads the reasons, one that names a time of day (a time at or after
`reasons.UNIX_EPOCH_FLOOR`, written with its date only a day or more away) makes the cycle run.

`skip` tells each new job what a cycle would: it comes after every job of its family (a job of
a higher class comes before its queue's other jobs, but after its own family's), so what the
cycle tells it is what its verdict key was told (a job of that key came first), or else, when no
other job has its (shape, time limit), its family's verdict at its queue's end, unless a backfill
window may hold it (`window_may_hold`); its key is known to fit (checked already); the queues
keep their order at the new instant (usage decays with time) and the queues that wait for their
quota do not change. A job told so starts, searches, reserves and nominates nothing, and changes
nothing for the jobs after it. Anything else: None, and the cycle runs. Only the `default`
policy leaves one here; `las` leaves its own (`core/quiet_las.py`); others run every cycle.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Final

from corral.core.decisions import CycleResult, Reason, Reasons, Why
from corral.core.fairshare import advance_usage, reclaiming
from corral.core.families import ADMISSION, REPEAT, Family, Verdict
from corral.core.jobs import PendingJob
from corral.core.model import JobId, QueueName
from corral.core.plugins import Profile
from corral.core.reasons import UNIX_EPOCH_FLOOR, runs_until
from corral.core.rejections import never_fits as why_never
from corral.core.rejections import reject_never_fitting
from corral.core.request import request_for
from corral.core.state import ClusterState

POLICIES: Final = ("default",)  # the policies whose cycles leave a summary
_Mark = tuple[int, int, int, int, int]


class QueueEnd:
    """A queue's end in a cycle's order, where a job that comes after all of its queue is looked
    at: the verdicts of its families (`repeats.Walk.passive`: what every ordinary job of a family
    is told there, unless a backfill window may hold it), and the backfill window then."""

    __slots__ = ("end", "families", "reserved")

    def __init__(self, passive: list[Family], reserved: bool, end: float | None) -> None:
        self.families: dict[int, Verdict] = {}
        for fam in passive:
            verdict = fam.verdict
            if verdict is not None and verdict.kind != REPEAT and verdict.part is None:
                self.families[fam.family] = verdict
        self.reserved = reserved  # the cycle held a reservation (a job with a time limit tries backfill)
        self.end = end  # `backfill.backfill_end` (None: no backfill window admits any job)


class Quiet:
    """What a cycle that decided nothing leaves for the arrivals after it (read by `skip`)."""

    __slots__ = (
        "checkpoint_wakes",
        "dated",
        "ends",
        "mark",
        "next_wake",
        "now",
        "order",
        "reservations",
        "told",
        "verdicts",
        "version",
    )

    def __init__(
        self,
        now: float,
        verdicts: dict[int, tuple[int, Reason]],
        version: int,
        ends: dict[QueueName, QueueEnd],
        order: list[str],
        mark: _Mark,
        result: CycleResult,
        told: Reasons | None,
    ) -> None:
        self.now = now  # the instant the reasons below were written for
        # verdict key -> (use version, what a later job of that key is told while it is `version`)
        self.verdicts = verdicts
        self.version = version
        self.ends = ends
        self.order = order  # the queues with pending jobs, in fair-share order
        self.mark = mark
        self.next_wake = result.next_wake
        self.checkpoint_wakes = result.checkpoint_wakes
        self.reservations = result.reservations  # (made again alike by every cycle until a change)
        # every job's reason at `now` (kept only where someone reads them: `ClusterState.runs_read`)
        self.told: Reasons | dict[JobId, Reason] | None = told
        # whether a reason in `told` names a time of day (`dated`), found when `told` is unfolded
        self.dated = False


def leave(
    state: ClusterState,
    profile: Profile,
    now: float,
    verdicts: dict[int, tuple[int, Reason]],
    deferred: bool,
    ends: dict[QueueName, QueueEnd] | None,
    result: CycleResult,
) -> Quiet | None:
    """The summary of a cycle that has just ended (None: it decided something, or the policy reads
    more than this summary holds)."""
    if (
        not state.quiet_kept  # (the live scheduler runs every cycle: nothing is built for it)
        or profile.name not in POLICIES
        or result.starts
        or result.preemptions
        or result.nominations
        or result.rejections
        or result.others is not None
        or deferred
        or profile.queue_order is None
        or profile.head_of_line
        or profile.promote_after is not None
        or state.estimating
        or now >= UNIX_EPOCH_FLOOR  # (`reasons.clock` then reads the time of day)
    ):
        return None
    if not verdicts and not ends:
        return None
    told = result.reasons if state.runs_read else None
    order = _order(state, profile)
    return Quiet(now, verdicts, state.use_version, ends or {}, order, _mark(state, 0), result, told)


def skip(state: ClusterState, profile: Profile, now: float, quiet: Quiet) -> CycleResult | None:
    """What a cycle at `now` would decide and tell, if only `state.unchecked` (jobs submitted since
    the cycle that left `quiet`) changed the state since, and it can be told without a look; the
    cycle's bookkeeping done (usage, the new jobs' requests). None: run the cycle."""
    new = state.unchecked
    if not new or now < quiet.now or now >= UNIX_EPOCH_FLOOR or not now < quiet.next_wake:
        return None
    if _mark(state, len(new)) != quiet.mark:
        return None
    told_new: list[tuple[PendingJob, Reason | None, float]] = []
    by_key: dict[int, int] = {}
    for job in new:
        by_key[job.verdict_key] = by_key.get(job.verdict_key, 0) + 1
    for job in new:
        found = told(state, quiet, job, now, by_key)
        if found is None:
            return None
        told_new.append((job, *found))
    if not last_in_families(state, new):
        return None
    every = quiet.told
    if every is not None:  # someone reads every job's reason
        if isinstance(every, Reasons):
            every = quiet.told = dict(every.items())
            quiet.dated = any(dated(why) for why in every.values())
        if quiet.dated or any(said is not None and dated(said) for _, said, _ in told_new):
            return None
    if profile.usage_half_life:  # what the cycle does first; at `now` again it does nothing
        advance_usage(state, now, profile.usage_half_life)
    if _order(state, profile) != quiet.order:
        return None
    if any(q.spec.quota for q in state.queues.values()) and reclaiming(state) != state.caches.reclaiming:
        return None  # a queue begins or ends waiting for its quota (`fairshare.note_reclaiming`)
    result = CycleResult(now, next_wake=quiet.next_wake, checkpoint_wakes=quiet.checkpoint_wakes)
    result.reservations = list(quiet.reservations)
    reject_never_fitting(state, result)  # rejects none (their keys fit), computes their requests
    reasons = result.reasons
    if every is not None:  # the old reasons, written for `now`
        for job_id, why in every.items():
            reasons[job_id] = at_time(why, quiet.now, now, state.jobs[job_id])
    for job, said, then in told_new:
        if said is None:  # (only where no one reads the reasons)
            continue
        if every is not None:
            every[job.spec.id] = at_time(said, then, quiet.now, job)  # (as if written then)
        reasons[job.spec.id] = at_time(said, then, now, job)
    quiet.mark = _mark(state, 0)
    return result


def told(
    state: ClusterState, quiet: Quiet, job: PendingJob, now: float, new_by_key: dict[int, int]
) -> tuple[Reason | None, float] | None:
    """What a cycle after `quiet` at `now` tells a new job that comes after every job of its family,
    and when that sentence was written (None: it is looked at, or may be; `new_by_key`: how many
    new jobs have each verdict key). A job whose key was answered at the cycle's last use version
    repeats that answer; one whose family has a verdict at its queue's end is told it, unless a
    backfill window may hold it (or, when other jobs of its key came first, nothing: it is told
    what the first of them was, which no one reads here)."""
    if out_of_reach(state, job, now):
        return None
    key, spec = job.verdict_key, job.spec
    found = quiet.verdicts.get(key)
    if found is not None and found[0] == quiet.version:
        return found[1], quiet.now
    end = quiet.ends.get(spec.queue)
    verdict = None if end is None else end.families.get(job.family)
    if end is None or verdict is None:
        return None
    queue = state.queues[spec.queue]
    shape = (job.shape, spec.queue, spec.priority, spec.time_limit)
    twin = state.interned((shape, not spec.preemptible))
    if twin is not None and queue.by_verdict.get(twin):
        return None  # a job of its (shape, time limit) told before it: it is told the same
    # jobs of its key came before it, not answered at the last version: it is told what the first
    # of them blocked was told (`_Cycle._blocked`), which only a look finds; nothing else happens
    told_before = len(queue.by_verdict.get(key, ())) != new_by_key[key]
    if told_before and quiet.told is not None:
        return None  # (someone reads the reasons: the cycle runs)
    limit = spec.time_limit
    if verdict.kind != ADMISSION and window_may_hold(end, limit, now):
        return None  # its backfill attempt may start it
    if told_before:
        return None, now  # (no one reads it)
    if verdict.kind == ADMISSION:
        return verdict.reason, now
    per_limit = verdict.per_limit
    if per_limit is None:
        return verdict.reason, now
    runs = runs_until(None if limit is None else now + limit, now)
    return Reason(per_limit.reason.code, per_limit.head + runs + per_limit.tail, per_limit.reason.at), now


def out_of_reach(state: ClusterState, job: PendingJob, now: float) -> bool:
    """Whether a cycle must run for a new job: gone, flagged, without a verdict key or shape, or
    one the cycle rejects as never fitting (found and remembered here, as the cycle's first step,
    `reject_never_fitting`, would)."""
    spec = job.spec
    if spec.id not in state.jobs or job.is_flagged(now) or job.verdict_key < 0 or job.shape is None:
        return True
    never_fits = state.caches.never_fits
    key = job.verdict_key
    if key not in never_fits:
        req = request_for(state, spec, job.shape)
        job.request, job.request_generation = req, state.generation
        never_fits[key] = why_never(state, spec, req)
    return never_fits[key] is not None


def window_may_hold(end: QueueEnd, limit: float | None, now: float) -> bool:
    """Whether a job with this time limit that misses its placement at the queue's end is tried for
    backfill there, and may start (`_Cycle.consider`, `backfill.attempt`)."""
    return limit is not None and end.reserved and end.end is not None and now + limit <= end.end


def last_in_families(state: ClusterState, new: list[PendingJob]) -> bool:
    """Whether the new jobs come after every other job of their families in their queues' order:
    then every job of their verdict keys and families that the cycle told something came before
    them (a job of a higher class comes before other jobs of its queue, but after those of its
    family), and what they are told changes nothing for the jobs after them."""
    count: dict[int, int] = {}
    for job in new:
        count[job.family] = count.get(job.family, 0) + 1
    for job in new:
        keys = state.queues[job.spec.queue].by_family.get(job.family, [])
        if bisect_left(keys, job.key) < len(keys) - count[job.family]:
            return False
    return True


def dated(why: Reason) -> bool:
    """Whether `why` may name a time at or after `UNIX_EPOCH_FLOOR` (a reservation's start, a
    protection's end, before the simulation's clock reaches it): `reasons.clock` writes it as a
    time of day, with the date only when it lies a day or more from the cycle's instant, so the
    sentence of a later instant may differ; such a cycle runs."""
    return "UTC" in why.message


def at_time(why: Reason, then: float, now: float, job: PendingJob) -> Reason:
    """`why`, written at `then` for `job`, as written at `now`: a sentence that names when the job
    would end if it started (`reasons.runs_until`) names it from `now`."""
    limit = job.spec.time_limit
    if then == now or limit is None or why.code not in (Why.BEHIND_RESERVATION, Why.RESERVED):
        return why
    old = f", and {runs_until(then + limit, then)}: "
    if old not in why.message:
        return why
    new = f", and {runs_until(now + limit, now)}: "
    return Reason(why.code, why.message.replace(old, new, 1), why.at)


def _order(state: ClusterState, profile: Profile) -> list[str]:
    """The queues with pending jobs, in the order a cycle takes them first (`order._run_fair`)."""
    order = profile.queue_order
    assert order is not None
    keyed = [
        (order.key(q, state), i, q.spec.name) for i, q in enumerate(state.queues.values()) if q.pending_keys
    ]
    keyed.sort()
    return [name for _, _, name in keyed]


def _mark(state: ClusterState, new: int) -> _Mark:
    """What changes with any change but a submission (`new`: jobs submitted since the mark)."""
    return (state.use_version, state.base_id, state.generation, len(state.running), len(state.jobs) - new)
