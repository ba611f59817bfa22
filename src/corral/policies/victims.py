"""Who may be preempted: by priority inside a queue, by reclaim across queues, or by attained service."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from operator import itemgetter

from corral.core.fairshare import can_reclaim
from corral.core.jobs import PendingJob, RunningAttempt
from corral.core.model import QueueName
from corral.core.state import ClusterState


def protected(victim: RunningAttempt, state: ClusterState, now: float) -> bool:
    """Never a non-preemptible job, one already stopping, or one inside its minimum run time
    (`ClusterState.min_runtime`: doubled for every earlier attempt of the job)."""
    if not victim.spec.preemptible or victim.preempting_deadline is not None:
        return True
    # `now < start + min_runtime`, not `now - start < min_runtime`: the sum is the time the cycle
    # wakes at (`Occupancy.protection_ends`), and the difference may round below it there
    return now < victim.start + state.min_runtime(victim)


_first = itemgetter(0)


@dataclass(frozen=True, slots=True)
class PriorityReclaimArgs:
    reclaim: bool = True  # across queues: restore each queue's guaranteed quota
    surplus: bool = False  # also rebalance borrowers above their quotas by preemption
    # across queues: spare a borrower that has run more than this many seconds since its last
    # checkpoint (its queue waits for it to end instead); 0: none spared (the quota's guarantee)
    spare_after: float = 0.0

    def __post_init__(self) -> None:
        if not self.spare_after >= 0:
            raise ValueError("spare_after must be >= 0 seconds (0: reclaim spares no borrower)")


@dataclass(frozen=True, slots=True)
class PriorityReclaim:
    """Inside a queue, a strictly higher class preempts; across queues of a cohort, reclaim (6.3).

    Victims: lowest class first, then least lost work (GPU-seconds since the last checkpoint
    plus GPUs x grace), then least overshoot below the victim queue's quota, then submit time
    and id.
    """

    args: PriorityReclaimArgs = PriorityReclaimArgs()
    bounds_by_group = True
    groups_by_family = True  # its queue, class and GPUs
    ranks_by_attempt = False  # reclaim and the order read the queues' counts

    def family_part(self, preemptor: PendingJob) -> int:
        return 0

    def preemptor_key(self, preemptor: PendingJob, now: float) -> Hashable | None:
        """Its queue, class and GPUs (what `eligible`, `group_eligible` and `permit` read)."""
        spec = preemptor.spec
        return (spec.queue, spec.priority, spec.gpus)

    def eligible(
        self, preemptor: PendingJob, victim: RunningAttempt, state: ClusterState, now: float
    ) -> bool:
        return reclaim_eligible(self.args, preemptor, victim, state, now)

    def group_eligible(
        self, preemptor: PendingJob, queue: QueueName, priority: int, state: ClusterState, now: float
    ) -> bool:
        return reclaim_group_eligible(self.args, preemptor, queue, priority, state)

    def order_key(self, victim: RunningAttempt, state: ClusterState, now: float) -> tuple[object, ...]:
        return reclaim_order_key(victim, state, now)

    def rank(
        self, preemptor: PendingJob, attempts: Iterable[RunningAttempt], state: ClusterState, now: float
    ) -> list[RunningAttempt]:
        keyed = [
            (self.order_key(a, state, now), a) for a in attempts if self.eligible(preemptor, a, state, now)
        ]
        keyed.sort(key=_first)
        return [a for _, a in keyed]

    def permit(
        self, preemptor: PendingJob, victims: Sequence[RunningAttempt], state: ClusterState, now: float
    ) -> bool:
        return reclaim_permit(self.args, preemptor, victims, state)

    def service_floor(self, preemptor: PendingJob) -> float | None:
        return None  # no floor of attained service: every candidate is ranked

    def protection_end(self, preemptor: PendingJob, state: ClusterState, now: float) -> float | None:
        return None  # `group_eligible` sees every group it may take from: the core's wake suffices

    def eligible_from(self, preemptor: PendingJob, state: ClusterState, now: float) -> float | None:
        return None

    def fresh_groups(
        self, preemptor: PendingJob, state: ClusterState, now: float
    ) -> tuple[tuple[QueueName, int], ...]:
        """With `spare_after`, a spared borrower becomes a candidate again when it checkpoints:
        the other queues' groups reclaim may take from."""
        if self.args.spare_after <= 0:
            return ()
        return reclaim_groups(self.args, preemptor, state)

    def fresh_for(self, preemptor: PendingJob) -> float:
        return self.args.spare_after  # a borrower is spared once it ran that long since a checkpoint


# `priority_reclaim`'s rules, for the plugins built on it (`tiresias`)
def reclaim_eligible(
    args: PriorityReclaimArgs, preemptor: PendingJob, victim: RunningAttempt, state: ClusterState, now: float
) -> bool:
    """`PriorityReclaim.eligible`: a higher class of its queue, or reclaim across queues."""
    return not protected(victim, state, now) and reclaim_unprotected(args, preemptor, victim, state, now)


def reclaim_unprotected(
    args: PriorityReclaimArgs, preemptor: PendingJob, victim: RunningAttempt, state: ClusterState, now: float
) -> bool:
    """`reclaim_eligible` of a victim known not to be `protected`."""
    mine, theirs = preemptor.spec, victim.spec
    if theirs.queue == mine.queue:
        return mine.priority > theirs.priority
    if not args.reclaim or _spared(args, victim, now):
        return False
    return can_reclaim(
        state,
        state.queues[mine.queue],
        mine.gpus,
        state.queues[theirs.queue],
        theirs.gpus,
        args.surplus,
    )


def _spared(args: PriorityReclaimArgs, victim: RunningAttempt, now: float) -> bool:
    spare = args.spare_after
    return spare > 0 and now - max(victim.start, victim.last_checkpoint) > spare


def reclaim_group_eligible(
    args: PriorityReclaimArgs, preemptor: PendingJob, queue: QueueName, priority: int, state: ClusterState
) -> bool:
    """`PriorityReclaim.group_eligible`."""
    mine = preemptor.spec
    if queue == mine.queue:
        return mine.priority > priority
    if not args.reclaim:
        return False
    victim = state.queues[queue]
    if victim.effective_gpus <= victim.spec.quota:
        return False  # reclaim takes only from a queue above its quota
    # reclaim is easier the less is taken: the group's smallest candidate bounds them all
    freed = state.occupancy.smallest((queue, priority))
    return can_reclaim(state, state.queues[mine.queue], mine.gpus, victim, freed, args.surplus)


def reclaim_groups(
    args: PriorityReclaimArgs, preemptor: PendingJob, state: ClusterState
) -> tuple[tuple[QueueName, int], ...]:
    """The other queues' (queue, class) groups that reclaim may take from for the preemptor."""
    mine = preemptor.spec.queue
    return tuple(
        (q, p)
        for q, p in state.occupancy.members
        if q != mine and reclaim_group_eligible(args, preemptor, q, p, state)
    )


def reclaim_order_key(victim: RunningAttempt, state: ClusterState, now: float) -> tuple[object, ...]:
    """`PriorityReclaim.order_key`."""
    spec = victim.spec
    queue = state.queues[spec.queue]
    overshoot = max(0, queue.spec.quota - (queue.effective_gpus - spec.gpus))
    return (spec.priority, victim.lost_work(now), overshoot, spec.submit_time, spec.id)


def reclaim_permit(
    args: PriorityReclaimArgs, preemptor: PendingJob, victims: Sequence[RunningAttempt], state: ClusterState
) -> bool:
    """The reclaim rule on the whole set: what each victim queue gives up, added together."""
    freed: dict[QueueName, int] = {}
    for v in victims:
        if v.spec.queue != preemptor.spec.queue:
            freed[v.spec.queue] = freed.get(v.spec.queue, 0) + v.spec.gpus
    taker = state.queues[preemptor.spec.queue]
    return all(
        can_reclaim(state, taker, preemptor.spec.gpus, state.queues[name], gpus, args.surplus)
        for name, gpus in freed.items()
    )


@dataclass(frozen=True, slots=True)
class AttainedServiceArgs:
    thresholds: tuple[float, ...] = (3600.0, 36000.0)


@dataclass(frozen=True, slots=True)
class AttainedService:
    """Tiresias-style: a waiting job preempts running ones in a higher attained-service level."""

    args: AttainedServiceArgs = AttainedServiceArgs()
    bounds_by_group = False  # attained service is per attempt
    groups_by_family = False  # the preemptor's attained service
    ranks_by_attempt = True  # levels, run times and lost work: the attempt and the time alone

    def _level(self, attained: float) -> int:
        return bisect_right(self.args.thresholds, attained)

    def family_part(self, preemptor: PendingJob) -> int:
        """`group_eligible` reads whether the preemptor is below the top attained-service level."""
        return int(self._level(preemptor.attained) < len(self.args.thresholds))

    def preemptor_key(self, preemptor: PendingJob, now: float) -> Hashable | None:
        """Its attained-service level (all that `eligible`, `group_eligible` and `rank` read)."""
        return self._level(preemptor.attained)

    def eligible(
        self, preemptor: PendingJob, victim: RunningAttempt, state: ClusterState, now: float
    ) -> bool:
        if protected(victim, state, now):
            return False
        served = victim.job.attained + victim.spec.gpus * (now - victim.start)
        return self._level(served) > self._level(preemptor.attained)

    def group_eligible(
        self, preemptor: PendingJob, queue: QueueName, priority: int, state: ClusterState, now: float
    ) -> bool:
        # attained service is per attempt (checked one by one); but nobody is above the top level
        return self._level(preemptor.attained) < len(self.args.thresholds)

    def service_floor(self, preemptor: PendingJob) -> float | None:
        """Every victim of the preemptor has at least this much attained service (GPU-seconds,
        `served.reaching`): the floor of the level above its own (None: it is in the top level)."""
        thresholds = self.args.thresholds
        mine = bisect_right(thresholds, preemptor.attained)
        return thresholds[mine] if mine < len(thresholds) else None

    def order_key(self, victim: RunningAttempt, state: ClusterState, now: float) -> tuple[object, ...]:
        served = victim.job.attained + victim.spec.gpus * (now - victim.start)
        return (-self._level(served), victim.lost_work(now), -victim.start, victim.spec.id)

    def rank(
        self, preemptor: PendingJob, attempts: Iterable[RunningAttempt], state: ClusterState, now: float
    ) -> list[RunningAttempt]:
        """`eligible` and `order_key` computed together, the level once per attempt."""
        thresholds = self.args.thresholds
        mine = bisect_right(thresholds, preemptor.attained)
        if mine >= len(thresholds):
            return []  # nobody is above the top level
        # the levels this preemptor may take from start at attained service `floor`
        floor = thresholds[mine]
        runtime_of = state.min_runtime_by_value
        keyed: list[tuple[int, float, float, str, RunningAttempt]] = []
        for a in attempts:
            job = a.job
            spec = job.spec
            start = a.start
            gpus = spec.gpus
            served = job.attained + gpus * (now - start)
            if served < floor:
                continue  # level <= mine
            # protected, inline: never non-preemptible, stopping, or inside its minimum run time
            if not spec.preemptible or a.preempting_deadline is not None:
                continue
            if now < start + runtime_of.get(spec.priority, 0.0) * (1 << min(a.attempt - 1, 6)):
                continue
            level = bisect_right(thresholds, served)
            # RunningAttempt.lost_work, inline
            lost = gpus * (max(0.0, now - max(start, a.last_checkpoint)) + spec.checkpoint_grace)
            # `order_key` and the attempt in one tuple: ids are unique, so the attempt is never compared
            keyed.append((-level, lost, -start, spec.id, a))
        keyed.sort()
        return [k[4] for k in keyed]

    def permit(
        self, preemptor: PendingJob, victims: Sequence[RunningAttempt], state: ClusterState, now: float
    ) -> bool:
        return True

    def protection_end(self, preemptor: PendingJob, state: ClusterState, now: float) -> float | None:
        return None

    def eligible_from(self, preemptor: PendingJob, state: ClusterState, now: float) -> float | None:
        return None

    def fresh_groups(
        self, preemptor: PendingJob, state: ClusterState, now: float
    ) -> tuple[tuple[QueueName, int], ...]:
        return ()  # lost work orders its victims, it never excludes one

    def fresh_for(self, preemptor: PendingJob) -> float:
        return 0.0
