"""Fair share: decayed usage, the two tiers of queue order, cohort borrowing and the reclaim rule.

Pure functions over the cluster state, used by the simulator and the control plane alike
(DESIGN.md 6.3). Quotas and limits count GPUs; weights and usage divide only what lies above
the quotas; reclaim looks at current allocation, never at decayed usage.
"""

from __future__ import annotations

import math

from corral.core.jobs import PendingJob, QueueState
from corral.core.state import ClusterState


def decay_usage(usage: float, gpus: float, elapsed: float, half_life: float) -> float:
    """Decayed GPU-seconds after `elapsed` seconds at a constant `gpus` allocation.

    usage(t) = usage * 2^(-t/h) + gpus * (h / ln 2) * (1 - 2^(-t/h)): the exact integral of
    an allocation whose past contributions halve every `half_life` seconds.
    """
    if elapsed <= 0:
        return usage
    factor: float = 0.5 ** (elapsed / half_life)
    return usage * factor + gpus * (half_life / math.log(2)) * (1.0 - factor)


def advance_usage(state: ClusterState, now: float, half_life: float) -> None:
    """Bring every queue's decayed usage up to `now` (call once per cycle, before ordering)."""
    last = state.usage_time
    state.usage_time = now
    if last is None:
        return
    elapsed = now - last
    if elapsed <= 0:
        return
    factor: float = 0.5 ** (elapsed / half_life)  # decay_usage, with the factor shared by every queue
    gain = (half_life / math.log(2)) * (1.0 - factor)
    for queue in state.queues.values():
        if queue.usage or queue.alloc_gpus:
            queue.usage = queue.usage * factor + queue.alloc_gpus * gain


def usage_share(state: ClusterState, queue: QueueState, half_life: float | None) -> float:
    """Decayed usage as a fraction of what the whole cluster would accumulate at full use."""
    if not half_life or not state.total_gpus:
        return 0.0
    return queue.usage / (state.total_gpus * half_life / math.log(2))


def dominant_share(state: ClusterState, queue: QueueState) -> float:
    """The largest of the queue's shares of GPUs, CPUs and memory."""
    shares = [queue.effective_gpus / state.total_gpus if state.total_gpus else 0.0]
    if state.total_cpus:
        shares.append(queue.alloc_cpus / state.total_cpus)
    if state.total_memory:
        shares.append(queue.alloc_memory / state.total_memory)
    return max(shares)


def surplus_share(state: ClusterState, queue: QueueState, gpus: int) -> float:
    """GPUs above the quota (after a change of `gpus`) divided by the weight and cluster size."""
    above = max(0, queue.effective_gpus + gpus - queue.spec.quota)
    return above / max(1, state.total_gpus) / queue.spec.weight


def fair_share_key(state: ClusterState, queue: QueueState, half_life: float | None) -> tuple[int, float, str]:
    """Two tiers: queues under their quota first (by use over quota), then borrowers by share.

    A borrower's share is its dominant share above its quota plus its decayed usage share,
    divided by its weight: a team that used a lot recently yields to one that did not.
    """
    spec = queue.spec
    use = queue.effective_gpus
    if use < spec.quota:
        return (0, use / spec.quota, spec.name)
    quota_share = spec.quota / state.total_gpus if state.total_gpus else 0.0
    above = max(0.0, dominant_share(state, queue) - quota_share)
    return (1, (above + usage_share(state, queue, half_life)) / spec.weight, spec.name)


def cohort_of(queue: QueueState) -> str:
    """Queues without a cohort share one implicit cohort."""
    return queue.spec.cohort


def borrow_room(state: ClusterState, queue: QueueState) -> tuple[int, int]:
    """(GPUs this queue may still add, GPUs free now), for a queue above its quota.

    The first counts every other queue at its use or its guaranteed quota, whichever is larger,
    except that idle quota of the queue's own cohort counts only beyond its lending limit:
    what is guaranteed to others and not lent is not to be borrowed. GPUs nobody is
    guaranteed form a pool that any cohort may borrow from. Computed for every queue at once,
    and cached until any queue's counted GPUs change.
    """
    caches = state.caches
    cached = caches.borrow_rooms
    if cached is None or cached[0] != state.use_version:
        cached = caches.borrow_rooms = (state.use_version, _borrow_rooms(state))
    return cached[1][queue.spec.name]


def _borrow_rooms(state: ClusterState) -> dict[str, tuple[int, int]]:
    queues = list(state.queues.values())
    use = [q.effective_gpus for q in queues]
    free = state.total_gpus - sum(use)
    if not _any_quota(state):  # nothing is guaranteed to anyone: only capacity limits borrowing
        return {q.spec.name: (free, free) for q in queues}
    waiting = state.caches.reclaiming = reclaiming(state)
    kept = [q.spec.quota if q.spec.name in waiting else q.spec.quota - q.spec.lendable for q in queues]
    # counted[c]: every queue at max(use, what it does not lend to cohort c)
    counted: dict[str, int] = {}
    for cohort in {cohort_of(q) for q in queues}:
        counted[cohort] = sum(
            max(u, k if cohort_of(q) == cohort else q.spec.quota)
            for q, u, k in zip(queues, use, kept, strict=True)
        )
    rooms: dict[str, tuple[int, int]] = {}
    for q, u, k in zip(queues, use, kept, strict=True):
        others = counted[cohort_of(q)] - max(u, k)
        rooms[q.spec.name] = (state.total_gpus - others - u, free)
    return rooms


def reclaiming(state: ClusterState) -> frozenset[str]:
    """Queues below their quota with a job waiting that fits in what their quota has left: they
    lend none of their idle quota while it waits (DESIGN.md 6.3).

    Without this, GPUs freed while such a job waits go to borrowers (a one-GPU borrower takes each
    GPU that ends), and every borrower on a node the job could take back stays inside its
    `min_runtime`: an eight-GPU job of a queue below its quota waited 8,564 s on the overload
    trace (bench/quota_guarantee.py). Held jobs, and jobs already nominated to GPUs being freed
    (their GPUs count toward the queue), do not count. Each family's jobs have one size, so this
    looks at one job per family, more only past held ones.
    """
    found: list[str] = []
    for q in state.queues.values():
        room = q.spec.quota - q.effective_gpus
        if room <= 0 or not q.pending:
            continue
        for keys in q.by_family.values():
            if not keys or q.pending[keys[0][-1]].spec.gpus > room:  # type: ignore[index]
                continue
            if any(_waits(q.pending[key[-1]]) for key in keys):  # type: ignore[index]
                found.append(q.spec.name)
                break
    return frozenset(found)


def note_reclaiming(state: ClusterState) -> None:
    """At a cycle's start: which queues wait for their quota may have changed since the last
    cycle without any queue's use changing (submits, holds, cancels); if it did, every borrowing
    answer did too (`ClusterState.use_version`)."""
    if not _any_quota(state):
        return
    waiting = reclaiming(state)
    if waiting != state.caches.reclaiming:
        state.caches.reclaiming = waiting
        state.use_version += 1


def _waits(job: PendingJob) -> bool:
    return not job.held and job.nomination is None


def _any_quota(state: ClusterState) -> bool:
    caches = state.caches
    if caches.any_quota is None:
        caches.any_quota = any(q.spec.quota for q in state.queues.values())
    return caches.any_quota


def can_reclaim(
    state: ClusterState, taker: QueueState, need: int, victim: QueueState, freed: int, surplus: bool = False
) -> bool:
    """May `taker` (needing `need` GPUs) take `freed` GPUs from `victim`? (DESIGN.md 6.3)

    Yes if the taker stays within its quota and the victim is above its quota; with `surplus`,
    also when the taker's share above its quota after the move is no greater than the victim's
    (borrowers rebalanced by preemption, as Volcano's and KAI's reclaim do). Both sides use
    current allocation, so two queues never take from each other back and forth.

    `surplus` is off in the default policy: on Philly as one shared cluster (a quarter of its
    size, quotas by virtual cluster, jobs without checkpoints) it preempted 50,743 jobs and lost
    47 % of all allocated GPU-hours, for 13x the average completion time of reclaiming only up to
    the quotas (docs/benchmarks.md). Without it, what lies above the quotas is shared by the
    queue order (the borrower with the lowest share gets freed GPUs first), as in Kueue without
    fair-sharing preemption.
    """
    if taker is victim or victim.effective_gpus <= victim.spec.quota or cohort_of(taker) != cohort_of(victim):
        return False
    if taker.effective_gpus + need <= taker.spec.quota:
        return True
    return surplus and surplus_share(state, taker, need) <= surplus_share(state, victim, -freed)
