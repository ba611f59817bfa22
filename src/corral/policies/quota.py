"""Admission: a queue's limit, its guaranteed quota, and borrowing idle GPUs from its cohort."""

from __future__ import annotations

from dataclasses import dataclass, field

from corral.core.decisions import Reason, Why
from corral.core.fairshare import borrow_room, cohort_of
from corral.core.jobs import PendingJob, QueueState
from corral.core.model import QueueName
from corral.core.state import ClusterState
from corral.policies.noargs import NoArgs


@dataclass(frozen=True, slots=True)
class Limit:
    """A queue never uses more than its limit (quota plus borrowed)."""

    args: NoArgs = field(default_factory=NoArgs)

    def admit(self, job: PendingJob, queue: QueueState, state: ClusterState) -> Reason | None:
        limit = queue.spec.limit
        if limit is None:
            return None
        use = queue.effective_gpus
        if use + job.spec.gpus <= limit:
            return None
        return Reason(
            Why.LIMIT,
            f"queue {queue.spec.name} is at its limit ({use} of {limit} GPUs in use; "
            f"this job needs {job.spec.gpus})",
        )


@dataclass(frozen=True, slots=True)
class Quota:
    """Inside the quota a job is always admitted; above it, only what the cohort can lend.

    A non-preemptible job runs only inside its queue's guaranteed quota.
    """

    args: NoArgs = field(default_factory=NoArgs)

    def admit(self, job: PendingJob, queue: QueueState, state: ClusterState) -> Reason | None:
        spec = queue.spec
        use, need = queue.effective_gpus, job.spec.gpus
        if use + need <= spec.quota:
            return None
        if not job.spec.preemptible:
            return Reason(
                Why.QUOTA,
                f"non-preemptible: runs only inside queue {spec.name}'s quota "
                f"({use} of {spec.quota} GPUs in use; needs {need})",
            )
        room, free = borrow_room(state, queue)
        if need <= room or need > free:
            return None  # entitled; or blocked by capacity, which placement and reservations handle
        borrow = use + need - spec.quota
        cohort = f"cohort {spec.cohort}" if spec.cohort else "the shared cohort"
        return Reason(
            Why.COHORT,
            f"queue {spec.name} would borrow {borrow} GPUs above its quota of {spec.quota} "
            f"({use} in use, needs {need}); {cohort} can lend {max(0, room)} now: the other GPUs are "
            f"guaranteed to other queues{_waiting(state, queue)}",
        )


def _waiting(state: ClusterState, queue: QueueState) -> str:
    """The queues of its cohort that lend nothing now because a job of theirs waits inside their
    quota (`fairshare.reclaiming`), as a clause of the reason."""
    cohort = cohort_of(queue)
    queues = state.queues
    names = sorted(
        n
        for n in state.caches.reclaiming
        if n != queue.spec.name and cohort_of(queues[QueueName(n)]) == cohort
    )
    if not names:
        return ""
    if len(names) == 1:
        return f" (queue {names[0]} has jobs waiting within its quota: it lends none of it meanwhile)"
    listed = ", ".join(names)
    return f" (queues {listed} have jobs waiting within their quotas: they lend none of them meanwhile)"
