"""Who runs on each node: the running attempts per node, and per (queue, class) aggregates of the
preemptible ones, so that victim selection can bound what each node could free without visiting
every attempt in the cluster.
"""

from __future__ import annotations

from corral.core.jobs import RunningAttempt
from corral.core.model import JobId, QueueName

Group = tuple[QueueName, int]  # (queue, priority value)


class Occupancy:
    """Per node: attempts touching it, and GPUs plus GPU-seconds-since-checkpoint per group."""

    __slots__ = ("groups", "jobs", "members", "totals")

    def __init__(self) -> None:
        self.jobs: list[dict[JobId, RunningAttempt]] = []
        # node -> group -> [GPUs, sum of GPUs x (time of the last checkpoint or start)]
        self.groups: list[dict[Group, list[float]]] = []
        self.totals: dict[Group, float] = {}  # GPUs per group over the whole cluster
        self.members: dict[Group, dict[JobId, RunningAttempt]] = {}  # the attempts counted per group

    def add_node(self) -> None:
        self.jobs.append({})
        self.groups.append({})

    def add(self, attempt: RunningAttempt) -> None:
        job_id = attempt.spec.id
        for node, _ in attempt.placement:
            self.jobs[node][job_id] = attempt
        if attempt.spec.preemptible and attempt.preempting_deadline is None:
            self._count(attempt, 1.0)

    def remove(self, attempt: RunningAttempt) -> None:
        job_id = attempt.spec.id
        for node, _ in attempt.placement:
            self.jobs[node].pop(job_id, None)
        if attempt.spec.preemptible and attempt.preempting_deadline is None:
            self._count(attempt, -1.0)

    def stopping(self, attempt: RunningAttempt) -> None:
        """An attempt is being preempted: it is no longer a candidate victim."""
        if attempt.spec.preemptible and attempt.preempting_deadline is None:
            self._count(attempt, -1.0)

    def checkpointed(self, attempt: RunningAttempt, before: float) -> None:
        """The attempt's last checkpoint moved from `before` to `attempt.last_checkpoint`."""
        if not attempt.spec.preemptible or attempt.preempting_deadline is not None:
            return
        key = (attempt.spec.queue, attempt.spec.priority)
        old = max(attempt.start, before)
        new = max(attempt.start, attempt.last_checkpoint)
        for node, mask in attempt.placement:
            self.groups[node][key][1] += mask.bit_count() * (new - old)

    def _count(self, attempt: RunningAttempt, sign: float) -> None:
        key = (attempt.spec.queue, attempt.spec.priority)
        since = max(attempt.start, attempt.last_checkpoint)
        total = self.totals.get(key, 0.0) + sign * attempt.spec.gpus
        if total > 0:
            self.totals[key] = total
        else:
            self.totals.pop(key, None)
        members = self.members.get(key)
        if sign > 0:
            if members is None:
                members = self.members[key] = {}
            members[attempt.spec.id] = attempt
        elif members is not None:
            members.pop(attempt.spec.id, None)
            if not members:
                del self.members[key]
        for node, mask in attempt.placement:
            gpus = mask.bit_count()
            per_node = self.groups[node]
            entry = per_node.get(key)
            if entry is None:
                entry = per_node[key] = [0.0, 0.0]
            entry[0] += sign * gpus
            entry[1] += sign * gpus * since
            if entry[0] <= 0:
                del per_node[key]
