"""Cycles after arrivals alone under `las`, told without running them: what a `las` cycle that
decided nothing leaves (`leave`), and the next cycle's answer (`skip`), for the simulator.

`core/quiet.py` does this for `default`. Under `las` (one global order by attained-service level,
then submit time; no quotas, reservations or backfill; victims in a higher level) what moves with
the time alone between two cycles is: the attained service of running attempts (their levels
cross the thresholds: who may be a victim of whom), the end of their `min_runtime` protection
(who may be a victim at all, and the sentences naming it), their lost work (the victims' order)
and the cycle's `next_wake` (backoffs). Pending jobs' attained service, hence their order, does
not move. A cycle that decided nothing leaves a `LasQuiet` with a `horizon`: the earliest of its
`next_wake`, of the end of any running attempt's protection after it, and of any running
attempt's next level (a second early, for float rounding). Before the horizon every attempt is
a candidate for the same preemptors as then, so every victim search of a job that was looked at
finds the same candidates; the order of the candidates is read only once a search has chosen
nodes (`preempt._confirm`: `ClusterState.victims_ordered`; a cycle where one did leaves nothing);
a search that misses before that misses on counts alone (no candidates, too few replicas on the
candidates' nodes and the free GPUs, no domain that holds the gang), which the order does not
change. So each job that was there is told what it was told then.

A new job (attained service 0: after every waiting job of the lowest level, before the jobs of
higher levels, which were preempted) is told without a look when a job of its verdict key that
was there comes before it and is not flagged: `consider` tells every later job of that key what
the first was told (the walk tells what looking at each job in order would), with no side effect,
so the jobs after it see what they saw. Anything else: None, and the cycle runs.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from typing import Final

from corral.core.decisions import CycleResult, Reason, Reasons
from corral.core.jobs import PendingJob
from corral.core.model import JobId
from corral.core.plugins import Profile
from corral.core.quiet import Quiet, _mark, at_time, dated, out_of_reach
from corral.core.reasons import UNIX_EPOCH_FLOOR
from corral.core.rejections import reject_never_fitting
from corral.core.served import use_index
from corral.core.state import ClusterState

POLICIES: Final = ("las",)  # the policies whose cycles leave a `LasQuiet`
SKIP = True  # tell `las` cycles after arrivals alone (tests turn it off)
MARGIN = 1.0  # seconds before a running attempt's next level that the horizon ends
Later = Callable[[PendingJob], "Reason | None"]  # `_Cycle.told_later`


class LasQuiet(Quiet):
    """What a `las` cycle that decided nothing leaves: `Quiet`'s verdicts, reasons and mark (no
    queue ends, no queue order), and the instant before which no attempt changes level or
    protection and no wake is due (`horizon`)."""

    __slots__ = ("horizon", "jobs", "later", "tries")

    def __init__(
        self,
        now: float,
        verdicts: dict[int, tuple[int, Reason]],
        version: int,
        mark: tuple[int, int, int, int, int],
        result: CycleResult,
        told: Reasons | None,
        horizon: float,
        later: Later,
        tries: int,
    ) -> None:
        super().__init__(now, verdicts, version, {}, [], mark, result, told)
        self.horizon = horizon
        self.later = later  # `_Cycle.told_later` of the cycle that left it
        self.tries = tries  # the victim searches it may still start before it defers any
        self.jobs = mark[4]  # its pending jobs


def leave(
    state: ClusterState,
    profile: Profile,
    now: float,
    verdicts: dict[int, tuple[int, Reason]],
    deferred: bool,
    result: CycleResult,
    later: Later,
    tries: int,
) -> LasQuiet | None:
    """The summary of a `las` cycle that has just ended (None: it decided something, a search of
    it read the victims' order, or the profile reads more than this summary holds)."""
    ordered, state.victims_ordered = state.victims_ordered, 0
    if (
        not SKIP
        or not state.quiet_kept
        or profile.name not in POLICIES
        or ordered
        or result.starts
        or result.preemptions
        or result.nominations
        or result.rejections
        or result.reservations
        or result.others is not None
        or deferred
        or not verdicts
        or profile.queue_order is not None
        or profile.head_of_line
        or profile.backfill
        or profile.promote_after is not None
        or profile.usage_half_life
        or state.estimating
        or now >= UNIX_EPOCH_FLOOR  # (`reasons.clock` then reads the time of day)
    ):
        return None
    thresholds = _thresholds(profile)
    if thresholds is None:
        return None
    horizon = min(result.next_wake, changes(state, thresholds, now))
    if not horizon > now:
        return None
    told = result.reasons if state.runs_read else None
    left = profile.max_preemption_tries - tries
    return LasQuiet(now, verdicts, state.use_version, _mark(state, 0), result, told, horizon, later, left)


def _thresholds(profile: Profile) -> tuple[float, ...] | None:
    """The attained-service thresholds of the victims plugin (`AttainedService`), when the job
    order's levels are the same (`LeastAttained`: level, then submit time): then a job's
    preemptor key is its order key's first item. None: another profile."""
    victims, order = profile.victims, profile.job_order
    if victims is None or not hasattr(victims, "service_floor") or not hasattr(order, "level"):
        return None
    thresholds = getattr(getattr(victims, "args", None), "thresholds", None)
    if (
        not isinstance(thresholds, tuple)
        or getattr(getattr(order, "args", None), "thresholds", None) != thresholds
    ):
        return None
    return thresholds


def changes(state: ClusterState, thresholds: tuple[float, ...], now: float) -> float:
    """The earliest instant at which a running attempt's protection ends (it becomes a candidate
    victim: `Occupancy.next_settle`, at or before `now` when one is not counted yet), or, less
    `MARGIN`, a candidate's attained service reaches a threshold (`served.Reaching`; one that
    reached it less than `MARGIN` before `now` counts as reaching it now: float rounding).
    INFINITY: none. Only candidates' levels are read: an attempt inside its protection, stopping
    or not preemptible is no victim. A threshold that no ranking asked about yet (the floor of
    the level above a preemptor's, `Reaching.first_after`) is not read: no search of a job of
    the level below it read who reached it (they all rank through the index), so none does in
    a cycle told alike (the new jobs' own floor is read when their searches were)."""
    if not use_index():
        return now  # (rankings read every candidate: every threshold is read)
    occupancy = state.occupancy
    soonest = occupancy.next_settle()  # (at or before it, `now` included: no summary)
    reaching = occupancy.reaching
    for floor in thresholds:
        at = reaching.first_after(floor, now - MARGIN) - MARGIN
        if at < soonest:
            soonest = at
    return soonest


def skip(state: ClusterState, profile: Profile, now: float, quiet: LasQuiet) -> CycleResult | None:
    """What a `las` cycle at `now` would decide and tell, if only `state.unchecked` changed the
    state since the cycle that left `quiet`, and it can be told without a look; the cycle's
    bookkeeping done (the new jobs' requests). None: run the cycle."""
    new = state.unchecked
    if not new or now < quiet.now or now >= UNIX_EPOCH_FLOOR or not now < quiet.horizon:
        return None
    if _mark(state, len(new)) != quiet.mark:
        return None
    fresh = {job.spec.id for job in new}
    told_new: list[tuple[PendingJob, Reason]] = []
    for job in new:
        said = told(state, quiet, job, now, fresh)
        if said is None:
            return None
        told_new.append((job, said))
    every = quiet.told
    if every is not None:  # someone reads every job's reason
        if isinstance(every, Reasons):
            every = quiet.told = dict(every.items())
            quiet.dated = any(dated(why) for why in every.values())
        if quiet.dated or any(dated(said) for _, said in told_new):
            return None
    result = CycleResult(now, next_wake=quiet.next_wake, checkpoint_wakes=quiet.checkpoint_wakes)
    reject_never_fitting(state, result)  # rejects none (their keys fit), computes their requests
    reasons = result.reasons
    if every is not None:  # the old reasons, written for `now`
        for job_id, why in every.items():
            reasons[job_id] = at_time(why, quiet.now, now, state.jobs[job_id])
        for job, said in told_new:
            every[job.spec.id] = said
            reasons[job.spec.id] = said
    quiet.mark = _mark(state, 0)
    return result


def told(
    state: ClusterState, quiet: LasQuiet, job: PendingJob, now: float, fresh: set[JobId]
) -> Reason | None:
    """What a `las` cycle after `quiet` at `now` tells a new job (None: it is looked at, or may
    be): its verdict key's answer, when the first job of that key in the order that is not
    flagged was there at the last cycle, and comes before it (`fresh`: the new jobs)."""
    if out_of_reach(state, job, now):
        return None
    key, spec = job.verdict_key, job.spec
    queue = state.queues[spec.queue]
    setter = job  # the first job of its key that `consider` gives an answer it records
    for order_key in queue.by_verdict.get(key, ()):
        other = state.jobs[order_key[-1]]  # type: ignore[index]
        if not (other.held or other.nomination is not None or other.not_before > now):
            setter = other
            break
    if setter is not job and setter.spec.submit_time > quiet.now:
        return None  # (a job told since that cycle: its answer is not kept here)
    found = quiet.verdicts.get(key)
    if found is not None and found[0] == quiet.version:  # `consider` repeats its key's first answer
        return found[1] if setter is not job else None
    # no answer recorded for its key (a walk passed the setter in a run, or there is none): it is
    # told what looking at the setter tells, which no job of the twin key can have told first
    twin = state.interned(((job.shape, spec.queue, spec.priority, spec.time_limit), not spec.preemptible))
    if twin is not None and queue.by_verdict.get(twin):
        return None
    if setter is not job:  # an older job of its level, key and nodes avoided: told alike
        if setter.key[0] != job.key[0] or setter.avoid_nodes:
            return None
        return quiet.later(job)
    # it is looked at: no job the cycle saw has its key (it would be told its answer), every job
    # of its level that the cycle saw comes before it, and looking at the new jobs defers no search
    if any(k[-1] not in fresh for k in queue.by_verdict.get(key, ())):
        return None
    if len(state.jobs) - quiet.jobs >= quiet.tries:
        return None
    level = job.key[0]
    if not isinstance(level, int):
        return None
    for other_queue in state.queues.values():
        keys = other_queue.pending_keys
        i = bisect_left(keys, (level + 1,))
        last = keys[i - 1] if i else None
        if last is not None and last > job.key and not last[1] > quiet.now:  # type: ignore[operator]
            return None  # (a job of its level the cycle saw comes after it)
    return quiet.later(job)
