"""Tiresias inside a queue: discretised two-dimensional least attained service (2D-LAS).

A job's *level* is how many `thresholds` its attained service (GPU-seconds received so far, by
all its attempts) has reached: level 0 until the first threshold, and so on. Inside a queue and a
priority class, jobs wait by level, then first come first served (submit time); a waiting job
preempts a running job of its own queue and class whose level is strictly worse, only while the
victim would lose at most `max_lost` seconds of work (since its last checkpoint, or its start).
`starve` (seconds, 0: off) promotes a job that has waited that long in its current wait to level
0 (`core/aging.py`). Reclaim across queues is `default`'s, except that for `patience` seconds
after its submission a job takes back its queue's quota only from borrowers that would lose at
most `max_lost` of work (after that, from any: the guarantee comes later, not never).
Two options read run times learned from history (`core/estimates.py`), both off by default:
`estimate_weight` orders the jobs of a level by estimated remaining run time aged by waiting
(`shortest_estimated`'s order, inside a level; `patience` then counts from the time the order
places a job at, so that a later job of a family never reclaims more than an earlier one), and
`hold_after` lets reservations rest on the estimated ends of jobs without a time limit
(`Profile.hold_after`, `core/estimated_holds.py`).
Everything else is `default`'s: queues by fair share, quotas and limits, preemption by higher
classes, reservations and backfill.

Gu et al., "Tiresias: A GPU Cluster Manager for Distributed Deep Learning", NSDI '19.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from operator import itemgetter

from corral.core.jobs import PendingJob, RunningAttempt
from corral.core.model import QueueName
from corral.core.state import ClusterState
from corral.policies import tiresias_fresh, tiresias_memo
from corral.policies.tiresias_memo import FreshMemo
from corral.policies.victims import (
    PriorityReclaimArgs,
    protected,
    reclaim_group_eligible,
    reclaim_groups,
    reclaim_order_key,
    reclaim_permit,
    reclaim_unprotected,
)

_first = itemgetter(0)


@dataclass(frozen=True, slots=True)
class TiresiasArgs(PriorityReclaimArgs):
    # GPU-seconds of attained service at which a job drops one level (increasing); one threshold
    # at 16 GPU-hours by default (Tiresias' two queues)
    thresholds: tuple[float, ...] = (57_600.0,)
    max_lost: float = 600.0  # seconds of work a level preemption may cost its victim at most
    starve: float = 0.0  # seconds of waiting after which a job is promoted to level 0 (0: never)
    # seconds after its submission during which a job reclaims its queue's quota only from
    # borrowers that would lose at most `max_lost` of work (0: from any borrower at once); six
    # hours by default (issue 16, sixth pass: restarts of long borrowers made Philly's tail)
    patience: float = 21_600.0
    # inside a level, a job is placed as if submitted `estimate_weight` x its estimated remaining
    # run time (at most `estimate_cap` seconds) later: shortest expected first, aged by waiting
    # (0: first come, first served, and nothing is learned for the order)
    estimate_weight: float = 4.0
    estimate_cap: float = 86_400.0
    # reservations on the estimated ends of jobs without a time limit: held at once on a confident
    # estimate, else once the job has waited this many seconds (`Profile.hold_after`; None: none)
    hold_after: float | None = None

    def __post_init__(self) -> None:
        PriorityReclaimArgs.__post_init__(self)
        if not self.thresholds or list(self.thresholds) != sorted(set(self.thresholds)):
            raise ValueError("thresholds must be one or more increasing GPU-seconds, e.g. [57600]")
        if any(not t > 0 for t in self.thresholds):
            raise ValueError("thresholds must be > 0 GPU-seconds")
        if not self.max_lost >= 0:
            raise ValueError("max_lost must be >= 0 seconds (0: only just-checkpointed victims)")
        if not self.starve >= 0:
            raise ValueError("starve must be >= 0 seconds (0: no promotion)")
        if not self.patience >= 0:
            raise ValueError("patience must be >= 0 seconds (0: reclaim from any borrower at once)")
        if not self.estimate_weight >= 0:
            raise ValueError("estimate_weight must be >= 0 (0: first come, first served inside a level)")
        if not self.estimate_cap >= 0:
            raise ValueError("estimate_cap must be >= 0 seconds (the most run time that delays a job)")
        hold = self.hold_after
        if hold is not None and (not isinstance(hold, (int, float)) or not hold >= 0):
            raise ValueError("hold_after must be >= 0 seconds, or unset (no reservations on estimated ends)")


@dataclass(frozen=True, slots=True)
class Tiresias:
    """The order inside a queue and the victims (one plugin for both: one set of arguments).

    As victims it is `priority_reclaim` (same victim order, same reclaim rule across queues)
    plus level preemption inside the preemptor's own queue and class.
    """

    args: TiresiasArgs = TiresiasArgs()
    # answers about a group's candidates while nothing they read changed (`tiresias_memo`)
    memo: FreshMemo = field(default_factory=FreshMemo, compare=False, repr=False)
    bounds_by_group = True
    groups_by_family = False  # the preemptor's level is beyond its family: `family_part`
    ranks_by_attempt = False  # reclaim and the order read the queues' counts

    def level(self, attained: float) -> int:
        return bisect_right(self.args.thresholds, attained)

    def job_level(self, job: PendingJob) -> int:
        """A waiting job's level: from its attained service, or 0 once promoted."""
        return 0 if job.promoted else bisect_right(self.args.thresholds, job.attained)

    # ---- the order inside a queue ------------------------------------------------------
    def key(self, job: PendingJob) -> tuple[object, ...]:
        s = job.spec
        return (-s.priority, self.job_level(job), self.placed_at(job), s.seq, s.id)

    def placed_at(self, job: PendingJob) -> float:
        """The time the order places a job at inside its level: its submit time, plus
        `estimate_weight` x its estimated remaining run time (up to `estimate_cap`) when that
        weight is set and history gave an estimate."""
        s = job.spec
        weight = self.args.estimate_weight
        estimate = job.estimate
        if weight <= 0 or estimate is None:
            return s.submit_time
        remaining = max(0.0, estimate.seconds - (job.attained / s.gpus if s.gpus else 0.0))
        return s.submit_time + weight * min(remaining, self.args.estimate_cap)

    def reads_estimates(self) -> bool:
        """Whether the order reads `PendingJob.estimate` (`Profile.uses_estimates`)."""
        return self.args.estimate_weight > 0

    def promote_after(self) -> float | None:
        """`Profile.promote_after`: `starve`, or None when it is 0."""
        return self.args.starve if self.args.starve > 0 else None

    # ---- victims -------------------------------------------------------------------------
    def family_part(self, preemptor: PendingJob) -> int:
        """Its level. `patience` reads its `placed_at` too, but a walk meets a family's jobs of
        one level in that order, and a later one may take no borrower an earlier one may not."""
        return self.job_level(preemptor)

    def preemptor_key(self, preemptor: PendingJob, now: float) -> Hashable | None:
        """Its queue, class and GPUs (reclaim's), its level, and whether its `patience` is over at
        `now`: all that `eligible`, `group_eligible`, `rank`, `permit` and `narrow` read of it (the
        fresh candidates `narrow` reads are the state's, which a cycle's memory is keyed by)."""
        spec = preemptor.spec
        return (
            spec.queue,
            spec.priority,
            spec.gpus,
            self.job_level(preemptor),
            self._patience_over(preemptor, now),
        )

    def eligible(
        self, preemptor: PendingJob, victim: RunningAttempt, state: ClusterState, now: float
    ) -> bool:
        if protected(victim, state, now):
            return False
        return self._unprotected(preemptor, victim, state, now, self.job_level(preemptor), None)

    def _unprotected(
        self,
        preemptor: PendingJob,
        victim: RunningAttempt,
        state: ClusterState,
        now: float,
        level: int,
        patience_over: bool | None,
    ) -> bool:
        """`eligible` of a victim known not to be `protected`, the preemptor's level given (and
        whether its patience is over, None: not asked yet)."""
        mine, theirs = preemptor.spec, victim.spec
        if theirs.queue != mine.queue:
            # reclaim, of a borrower that would lose at most `max_lost`, or any once the
            # preemptor's patience is over (the guarantee, later)
            if not reclaim_unprotected(self.args, preemptor, victim, state, now):
                return False
            if patience_over is None:
                patience_over = self._patience_over(preemptor, now)
            return patience_over or now - max(victim.start, victim.last_checkpoint) <= self.args.max_lost
        if theirs.priority != mine.priority:
            return mine.priority > theirs.priority  # a lower class of its own queue
        if now - max(victim.start, victim.last_checkpoint) > self.args.max_lost:
            return False
        served = victim.job.attained + theirs.gpus * (now - victim.start)
        return self.level(served) > level

    def group_eligible(
        self, preemptor: PendingJob, queue: QueueName, priority: int, state: ClusterState, now: float
    ) -> bool:
        mine = preemptor.spec
        if queue != mine.queue or priority != mine.priority:
            return reclaim_group_eligible(self.args, preemptor, queue, priority, state)
        return self._worse_fresh(preemptor, (queue, priority), state, now)

    def order_key(self, victim: RunningAttempt, state: ClusterState, now: float) -> tuple[object, ...]:
        return reclaim_order_key(victim, state, now)

    def rank(
        self, preemptor: PendingJob, attempts: Iterable[RunningAttempt], state: ClusterState, now: float
    ) -> list[RunningAttempt]:
        level, over = self.job_level(preemptor), self._patience_over(preemptor, now)
        keyed = [
            (reclaim_order_key(a, state, now), a)
            for a in attempts
            if not protected(a, state, now) and self._unprotected(preemptor, a, state, now, level, over)
        ]
        keyed.sort(key=_first)
        return [a for _, a in keyed]

    def permit(
        self, preemptor: PendingJob, victims: Sequence[RunningAttempt], state: ClusterState, now: float
    ) -> bool:
        """`priority_reclaim`'s: the reclaim rule on what each other queue gives up together."""
        return reclaim_permit(self.args, preemptor, victims, state)

    def narrow(
        self, preemptor: PendingJob, group: tuple[QueueName, int], state: ClusterState, now: float
    ) -> list[RunningAttempt] | None:
        """The candidates it may take of a group (`core/narrow.py`): of its own queue and class,
        those in a worse level that checkpointed (or started) within `max_lost`, read from the
        newest checkpoints back; of another queue, while its `patience` lasts, those that
        checkpointed within `max_lost`; otherwise (a lower class of its own queue, or patience
        over) the whole group (None), as `eligible` allows."""
        mine = preemptor.spec
        if group != (mine.queue, mine.priority):
            if group[0] == mine.queue or self._patience_over(preemptor, now):
                return None
            return self._fresh_all(group, state, now, 0.0)
        thresholds = self.args.thresholds
        level = self.job_level(preemptor)
        if level >= len(thresholds):
            return []
        return self._fresh_all(group, state, now, thresholds[level])

    def _fresh_all(
        self, group: tuple[QueueName, int], state: ClusterState, now: float, floor: float
    ) -> list[RunningAttempt]:
        """`_fresh` of every one, remembered (`tiresias_memo`)."""
        if not tiresias_memo.REMEMBER:
            return self._fresh(group, state, now, floor, True)
        fresh = self.memo.current(state.occupancy, now).fresh
        found = fresh.get((group, floor))
        if found is None:
            found = fresh[(group, floor)] = self._fresh(group, state, now, floor, True)
        return list(found)

    def _patience_over(self, preemptor: PendingJob, now: float) -> bool:
        """Whether its patience is over (or there is none): reclaim may take any borrower. It
        counts from `placed_at` (the submit time unless `estimate_weight` is set)."""
        patience = self.args.patience
        return patience <= 0 or now - self.placed_at(preemptor) >= patience

    def _fresh(
        self, group: tuple[QueueName, int], state: ClusterState, now: float, floor: float, every: bool
    ) -> list[RunningAttempt]:
        """The group's candidates checkpointed (or started) since `now - max_lost` whose attained
        service has reached `floor` (`every` False: only the first found), newest first: only
        those are read (`tiresias_fresh`), not the whole group."""
        return tiresias_fresh.fresh(state.occupancy, group, now, now - self.args.max_lost, floor, every)

    def service_floor(self, preemptor: PendingJob) -> float | None:
        return None  # its levels read the queue's own attempts and reclaim takes any: no floor

    def protection_end(self, preemptor: PendingJob, state: ClusterState, now: float) -> float | None:
        """When the first attempt of its own queue and class that will then be below level 0
        leaves its minimum run time (`Preemption._until`: the cycle is due then; `group_eligible`
        reads only the attempts that are candidates now). Only one that could then lose at most
        `max_lost`: it has checkpointed in this attempt, or its start is recent enough. It reads
        of the preemptor only its queue and class, so that jobs of a family are told alike (a
        preemptor at level 1 or below may be woken for nothing). None: no such attempt."""
        spec = preemptor.spec
        group = (spec.queue, spec.priority)
        if not tiresias_memo.REMEMBER:
            return self._protection_end(group, state, now)
        ends = self.memo.current(state.occupancy, now).ends
        if group in ends:
            return ends[group]
        first = ends[group] = self._protection_end(group, state, now)
        return first

    def _protection_end(self, group: tuple[QueueName, int], state: ClusterState, now: float) -> float | None:
        return tiresias_fresh.protection_end(
            state.occupancy, group, now, self.args.thresholds[0], self.args.max_lost
        )

    def eligible_from(self, preemptor: PendingJob, state: ClusterState, now: float) -> float | None:
        """When its `patience` ends, if it has not and reclaim may take from some other queue: it
        may then take any borrower (the cycle is due then). A family's jobs of one level are met
        oldest first, so a later job's patience never ends earlier."""
        patience = self.args.patience
        if patience <= 0:
            return None
        end = self.placed_at(preemptor) + patience
        if end <= now or not reclaim_groups(self.args, preemptor, state):
            return None
        return end

    def fresh_groups(
        self, preemptor: PendingJob, state: ClusterState, now: float
    ) -> tuple[tuple[QueueName, int], ...]:
        """Where a checkpoint may give it a victim (it takes only those that would lose at most
        `max_lost`): its own queue and class below the last level (level preemption), and while
        its `patience` lasts the other queues' groups reclaim may take from."""
        spec = preemptor.spec
        own: tuple[tuple[QueueName, int], ...] = ()
        if self.job_level(preemptor) < len(self.args.thresholds):
            own = ((spec.queue, spec.priority),)
        if self._patience_over(preemptor, now):
            return own
        return own + reclaim_groups(self.args, preemptor, state)

    def fresh_for(self, preemptor: PendingJob) -> float:
        return self.args.max_lost

    def _worse_fresh(
        self, preemptor: PendingJob, group: tuple[QueueName, int], state: ClusterState, now: float
    ) -> bool:
        """Whether a candidate of the preemptor's own group has a worse level and would lose at
        most `max_lost` (`_fresh`: only the fresh candidates are read)."""
        thresholds = self.args.thresholds
        mine = self.job_level(preemptor)
        if mine >= len(thresholds):
            return False  # nobody is below the last level
        floor = thresholds[mine]
        if not tiresias_memo.REMEMBER:
            return bool(self._fresh(group, state, now, floor, False))
        worse = self.memo.current(state.occupancy, now).worse
        found = worse.get((group, floor))
        if found is None:
            found = worse[(group, floor)] = bool(self._fresh(group, state, now, floor, False))
        return found
