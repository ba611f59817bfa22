"""A `Victims` plugin narrowed to the preemptor's own queue: priority preemption inside a queue
when reclaim across queues is refused, and preemption to make room in a queue's own quota."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence

from corral.core.jobs import PendingJob, RunningAttempt
from corral.core.model import QueueName
from corral.core.plugins import Victims
from corral.core.state import ClusterState


class SameQueue:
    """A `Victims` plugin narrowed to the preemptor's own queue (priority preemption only).

    Used when the plugin's `permit` refuses a set that mixes queues: the job may still preempt
    lower classes of its own queue.
    """

    def __init__(self, inner: Victims) -> None:
        self.inner = inner
        self.bounds_by_group = inner.bounds_by_group
        self.groups_by_family = inner.groups_by_family
        self.ranks_by_attempt = inner.ranks_by_attempt

    def family_part(self, preemptor: PendingJob) -> int:
        return self.inner.family_part(preemptor)

    def preemptor_key(self, preemptor: PendingJob, now: float) -> Hashable | None:
        inner = self.inner.preemptor_key(preemptor, now)
        return None if inner is None else ("same queue", preemptor.spec.queue, inner)

    def eligible(
        self, preemptor: PendingJob, victim: RunningAttempt, state: ClusterState, now: float
    ) -> bool:
        return victim.spec.queue == preemptor.spec.queue and self.inner.eligible(
            preemptor, victim, state, now
        )

    def group_eligible(
        self, preemptor: PendingJob, queue: QueueName, priority: int, state: ClusterState, now: float
    ) -> bool:
        return queue == preemptor.spec.queue and self.inner.group_eligible(
            preemptor, queue, priority, state, now
        )

    def among(
        self, preemptor: PendingJob, group: tuple[QueueName, int], state: ClusterState, now: float
    ) -> list[RunningAttempt] | None:
        """The attempts of a group of its own queue that the inner plugin may take, and perhaps
        more (its `narrow`; None: the whole group): only those are ranked (`preempt._candidates`).
        The group is not narrowed (the bound and the remembered rankings stay as they are)."""
        narrow = getattr(self.inner, "narrow", None)
        if narrow is None or group[0] != preemptor.spec.queue:
            return None
        found: list[RunningAttempt] | None = narrow(preemptor, group, state, now)
        return found

    def service_floor(self, preemptor: PendingJob) -> float | None:
        """The inner plugin's (`served.reaching`; None when it has none)."""
        return self.inner.service_floor(preemptor)

    def order_key(self, victim: RunningAttempt, state: ClusterState, now: float) -> tuple[object, ...]:
        return self.inner.order_key(victim, state, now)

    def rank(
        self, preemptor: PendingJob, attempts: Iterable[RunningAttempt], state: ClusterState, now: float
    ) -> list[RunningAttempt]:
        mine = preemptor.spec.queue
        return self.inner.rank(preemptor, [a for a in attempts if a.spec.queue == mine], state, now)

    def permit(
        self, preemptor: PendingJob, victims: Sequence[RunningAttempt], state: ClusterState, now: float
    ) -> bool:
        return self.inner.permit(preemptor, victims, state, now)

    def protection_end(self, preemptor: PendingJob, state: ClusterState, now: float) -> float | None:
        return self.inner.protection_end(preemptor, state, now)

    def eligible_from(self, preemptor: PendingJob, state: ClusterState, now: float) -> float | None:
        """None: what time alone gives a plugin (`tiresias`' patience) concerns other queues."""
        return None

    def fresh_groups(
        self, preemptor: PendingJob, state: ClusterState, now: float
    ) -> tuple[tuple[QueueName, int], ...]:
        mine = preemptor.spec.queue
        return tuple(g for g in self.inner.fresh_groups(preemptor, state, now) if g[0] == mine)

    def fresh_for(self, preemptor: PendingJob) -> float:
        return self.inner.fresh_for(preemptor)
