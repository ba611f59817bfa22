"""Who runs on each node: the running attempts per node, and per (queue, class) aggregates of the
candidate victims, so that victim selection can bound what each node could free without visiting
every attempt in the cluster.

A candidate is a preemptible attempt that is not stopping and is past its minimum run time
(DESIGN.md 6.3: never one inside its `min_runtime`). Attempts wait in a heap by the time their
minimum run time ends and join the aggregates when `settle(now)` reaches it (a little early
rather than late, so that the aggregates stay an upper bound of what may be taken). An attempt
that ends while waiting leaves a stale heap entry; when stale entries are more than half of the
heap they are swept, so that a cluster where nothing ever needs victims (no `settle`) keeps no
ended attempt alive.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort

from corral.core.jobs import RunningAttempt
from corral.core.model import INFINITY, JobId, QueueName
from corral.core.served import Reaching

Group = tuple[QueueName, int]  # (queue, priority value)

_NONE, _WAITING, _COUNTED = 0, 1, 2  # RunningAttempt.candidate
COUNTED = _COUNTED  # a candidate now (in `members`)
WAITING = _WAITING  # inside its minimum run time (in `inside`)
_NO_FRESH: list[tuple[float, JobId]] = []
_NO_INSIDE: list[tuple[float, int, RunningAttempt]] = []
_EARLY = 1e-6  # seconds: settle this much early, so float rounding never settles late


class Occupancy:
    """Per node: attempts touching it, and GPUs plus GPU-seconds-since-checkpoint per group."""

    __slots__ = (
        "_by_group",
        "_fresh",
        "_seq",
        "_served_at",
        "_serving",
        "_stale",
        "_waiting",
        "changes",
        "groups",
        "jobs",
        "members",
        "reaching",
        "sizes",
        "totals",
    )

    def __init__(self) -> None:
        self.jobs: list[dict[JobId, RunningAttempt]] = []
        # node -> group -> [GPUs, sum of GPUs x (time of the last checkpoint or start)]
        self.groups: list[dict[Group, list[float]]] = []
        self.totals: dict[Group, float] = {}  # GPUs per group over the whole cluster
        self.members: dict[Group, dict[JobId, RunningAttempt]] = {}  # the candidates per group
        self.sizes: dict[Group, dict[int, int]] = {}  # group -> GPUs of a candidate -> how many
        self._waiting: list[tuple[float, int, RunningAttempt]] = []  # (settle time, seq, attempt)
        self._seq = 0
        self._stale = 0  # entries of `_waiting` whose attempt is no longer waiting
        # the same entries per group, for when each group's first protection ends (kept tidy by
        # `settle` and the sweep of stale entries)
        self._by_group: dict[Group, list[tuple[float, int, RunningAttempt]]] = {}
        # per group, (time of its last checkpoint or start, job id) of each candidate, sorted:
        # kept from the first call of `fresh` on (None: nobody asked)
        self._fresh: dict[Group, list[tuple[float, JobId]]] | None = None
        # per group, (service at the end of its minimum run time, seq, `_waiting`'s entry) of each
        # attempt inside it, sorted; and per attempt (its id) its group and key there: kept from
        # the first call of `serving` on (None: nobody asked)
        self._serving: dict[Group, list[tuple[float, int, tuple[float, int, RunningAttempt]]]] | None = None
        self._served_at: dict[int, tuple[Group, float, int]] = {}
        # the candidates by when their attained service reaches a level (`served`: `las`)
        self.reaching = Reaching()
        # bumped by every change of who is waiting, who is a candidate or when one checkpointed:
        # an answer read from them holds while it is unchanged (`tiresias_memo`)
        self.changes = 0

    def add_node(self) -> None:
        self.jobs.append({})
        self.groups.append({})

    def add(self, attempt: RunningAttempt, min_runtime: float) -> None:
        """A new attempt; a candidate once `min_runtime` seconds after its start have passed."""
        self.changes += 1
        spec = attempt.job.spec
        job_id = spec.id
        for node, _ in attempt.placement:
            self.jobs[node][job_id] = attempt
        if spec.preemptible and attempt.preempting_deadline is None:
            attempt.candidate = _WAITING
            self._seq += 1
            entry = (attempt.start + min_runtime, self._seq, attempt)
            heapq.heappush(self._waiting, entry)
            heapq.heappush(self._by_group.setdefault((spec.queue, spec.priority), []), entry)
            if self._serving is not None:
                self._serve(entry)

    def next_settle(self) -> float:
        """When `settle` next counts an attempt (its minimum run time ends, less `_EARLY`; maybe
        a stale entry's time: never later than the first that counts). INFINITY: none waits."""
        waiting = self._waiting
        return waiting[0][0] - _EARLY if waiting else INFINITY

    def settle(self, now: float) -> None:
        """Count every attempt whose minimum run time has ended by `now`."""
        waiting = self._waiting
        while waiting and waiting[0][0] - _EARLY <= now:
            attempt = heapq.heappop(waiting)[2]
            if attempt.candidate == _WAITING:
                attempt.candidate = _COUNTED
                self._count(attempt, 1.0)
                if self._serving is not None:
                    self._unserve(attempt)
            else:
                self._stale -= 1
            key = (attempt.job.spec.queue, attempt.job.spec.priority)
            mine = self._by_group.get(key)
            while mine and mine[0][2].candidate != _WAITING:  # settled in time order: at its top
                heapq.heappop(mine)
            if mine is not None and not mine:
                del self._by_group[key]

    def remove(self, attempt: RunningAttempt) -> None:
        job_id = attempt.job.spec.id
        for node, _ in attempt.placement:
            self.jobs[node].pop(job_id, None)
        self.stopping(attempt)

    def stopping(self, attempt: RunningAttempt) -> None:
        """An attempt is being preempted (or is gone): it is no longer a candidate victim."""
        self.changes += 1
        candidate = attempt.candidate
        attempt.candidate = _NONE
        if candidate == _COUNTED:
            self._count(attempt, -1.0)
        elif candidate == _WAITING:
            if self._serving is not None:
                self._unserve(attempt)
            self._stale += 1
            if self._stale > 64 and 2 * self._stale > len(self._waiting):
                self._waiting = [w for w in self._waiting if w[2].candidate == _WAITING]
                heapq.heapify(self._waiting)
                self._stale = 0
                self._by_group = {}
                for w in self._waiting:
                    self._by_group.setdefault((w[2].job.spec.queue, w[2].job.spec.priority), []).append(w)
                for entries in self._by_group.values():
                    heapq.heapify(entries)

    def protection_ends(self, now: float) -> dict[Group, float]:
        """Per group, the earliest time after `now` at which one of its attempts leaves its
        minimum run time and becomes a candidate (O(groups), amortised)."""
        ends: dict[Group, float] = {}
        for key, entries in list(self._by_group.items()):
            while entries and (entries[0][2].candidate != _WAITING or entries[0][0] <= now):
                heapq.heappop(entries)  # ended, settled, or settling now: no time to wait for
            if entries:
                ends[key] = entries[0][0]
            else:
                del self._by_group[key]
        return ends

    def inside(self, group: Group) -> list[tuple[float, int, RunningAttempt]]:
        """The group's attempts inside their minimum run time, as a heap of (time it ends, seq,
        attempt); read only. Stale entries (`candidate` no longer WAITING) are left in."""
        return self._by_group.get(group, _NO_INSIDE)

    def serving(self, group: Group, floor: float) -> list[tuple[float, int, RunningAttempt]]:
        """The group's entries of `inside` (none stale) whose attempt's service (its job's earlier
        attempts' plus GPUs x its minimum run time) may reach `floor` GPU-seconds by the time its
        minimum run time ends (a GPU-second of margin: callers check exactly); kept from the first
        call on, so that a policy whose victims must have reached a level (`tiresias`) reads only
        those, not every attempt that started within the minimum run time."""
        serving = self._serving
        if serving is None:
            serving = self._serving = {}
            for entry in self._waiting:
                if entry[2].candidate == _WAITING:
                    self._serve(entry)
        entries = serving.get(group)
        if not entries:
            return []
        return [e[2] for e in entries[bisect_left(entries, (floor - 1.0,)) :]]

    def _serve(self, entry: tuple[float, int, RunningAttempt]) -> None:
        attempt = entry[2]
        job = attempt.job
        key = (job.spec.queue, job.spec.priority)
        served = job.attained + job.spec.gpus * (entry[0] - attempt.start)
        assert self._serving is not None
        insort(self._serving.setdefault(key, []), (served, entry[1], entry))
        self._served_at[id(attempt)] = (key, served, entry[1])

    def _unserve(self, attempt: RunningAttempt) -> None:
        assert self._serving is not None
        key, served, seq = self._served_at.pop(id(attempt))
        entries = self._serving[key]
        del entries[bisect_left(entries, (served, seq))]
        if not entries:
            del self._serving[key]

    def waiting(self) -> int:
        """Entries in the heap of attempts inside their minimum run time (stale ones included)."""
        return len(self._waiting)

    def smallest(self, group: Group) -> int:
        """The fewest GPUs a candidate of the group holds (0 when it has none)."""
        sizes = self.sizes.get(group)
        return min(sizes) if sizes else 0

    def fresh(self, group: Group) -> list[tuple[float, JobId]]:
        """The group's candidates as (time of the last checkpoint or start, job id), oldest first
        (the last ones lose least work if preempted now); kept up to date from the first call on,
        so that a policy that preempts only jobs with little work to lose (`tiresias`' `max_lost`)
        reads the newest ones without visiting the others."""
        fresh = self._fresh
        if fresh is None:
            fresh = self._fresh = {}
            for key, members in self.members.items():
                fresh[key] = sorted((max(a.start, a.last_checkpoint), i) for i, a in members.items())
        return fresh.get(group, _NO_FRESH)

    def checkpointed(self, attempt: RunningAttempt, before: float) -> None:
        """The attempt's last checkpoint moved from `before` to `attempt.last_checkpoint`."""
        self.changes += 1  # a waiting attempt's checkpoint matters too (`Tiresias.protection_end`)
        if attempt.candidate != _COUNTED:
            return  # not counted yet: counted from its newest checkpoint when it settles
        key = (attempt.spec.queue, attempt.spec.priority)
        old = max(attempt.start, before)
        new = max(attempt.start, attempt.last_checkpoint)
        if self._fresh is not None and new != old:
            entries = self._fresh[key]
            del entries[bisect_left(entries, (old, attempt.spec.id))]
            insort(entries, (new, attempt.spec.id))
        for node, mask in attempt.placement:
            self.groups[node][key][1] += mask.bit_count() * (new - old)

    def _count(self, attempt: RunningAttempt, sign: float) -> None:
        self.changes += 1
        spec = attempt.spec
        key = (spec.queue, spec.priority)
        since = max(attempt.start, attempt.last_checkpoint)
        total = self.totals.get(key, 0.0) + sign * spec.gpus
        if total > 0:
            self.totals[key] = total
        else:
            self.totals.pop(key, None)
        members = self.members.get(key)
        sizes = self.sizes.get(key)
        if members is None or sizes is None:
            members = self.members[key] = {}
            sizes = self.sizes[key] = {}
        if sign > 0:
            members[spec.id] = attempt
            sizes[spec.gpus] = sizes.get(spec.gpus, 0) + 1
            self.reaching.join(attempt)
        else:
            del members[spec.id]
            self.reaching.leave(attempt)
            left = sizes[spec.gpus] - 1
            if left:
                sizes[spec.gpus] = left
            else:
                del sizes[spec.gpus]
            if not members:
                del self.members[key], self.sizes[key]
        fresh = self._fresh
        if fresh is not None:
            entries = fresh.get(key)
            if entries is None:
                entries = fresh[key] = []
            if sign > 0:
                insort(entries, (since, spec.id))
            else:
                del entries[bisect_left(entries, (since, spec.id))]
                if not entries:
                    del fresh[key]
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
