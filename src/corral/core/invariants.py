"""Invariants of the cluster state that every change must keep; `check` raises on a broken one.

Used by the tests after every cycle and by the benchmarks after every run, so that a fast wrong
answer cannot pass: no GPU given twice, masks and index agree, nominations and queue counts match.
"""

from __future__ import annotations

from corral.core.errors import InvariantError
from corral.core.model import JobId
from corral.core.state import ClusterState


def check(state: ClusterState) -> None:
    """No GPU given twice: allocation bits equal the union of running attempts' placements,
    no two attempts share a GPU, no two nominations share a GPU, the free-count index agrees
    with the masks, the nodes' attempt ends follow the attempts, and queues count what their
    attempts hold."""
    seen = [0] * len(state.specs)
    for attempt in state.running.values():
        for node, mask in attempt.placement:
            if seen[node] & mask:
                raise InvariantError(f"GPU given twice on {state.specs[node].name} (job {attempt.spec.id})")
            seen[node] |= mask
    if seen != state.alloc:
        bad = next(n for n in range(len(seen)) if seen[n] != state.alloc[n])
        raise InvariantError(
            f"allocation bits disagree with running attempts on {state.specs[bad].name}: "
            f"alloc={state.alloc[bad]:#x} attempts={seen[bad]:#x}"
        )
    for node in range(len(state.specs)):
        if state.reserved[node]:
            raise InvariantError(f"reservation left on {state.specs[node].name} after the cycle")
        free = (state.healthy[node] & ~state.alloc[node] & ~state.held[node]).bit_count()
        if state.free_count[node] != free:
            raise InvariantError(
                f"free count {state.free_count[node]} on {state.specs[node].name}, masks say {free}"
            )
        if state.is_schedulable(node) and state.index.avail[node] != free:
            where, says = state.specs[node].name, state.index.avail[node]
            raise InvariantError(f"index says {says} free on {where}, masks say {free}")
    ends: dict[int, list[tuple[float, int, JobId]]] = {}
    freed: dict[int, tuple[int, int]] = {}
    for attempt in state.running.values():
        key = attempt.end_key
        if key is not None:
            for node, mask in attempt.placement:
                if mask or attempt.exclusive:
                    ends.setdefault(node, []).append(key)
                    masks, whole = freed.get(node, (0, 0))
                    freed[node] = (masks | mask, whole + attempt.exclusive)
    for keys in ends.values():
        keys.sort()
    lasts = sorted((k[-1][0], k[-1][1], k[-1][2], node) for node, k in ends.items())
    if ends != state.node_ends or lasts != state.last_ends or freed != state.node_freed:
        raise InvariantError("the nodes' attempt ends disagree with the running attempts")
    held = [0] * len(state.specs)
    for job in state.jobs.values():
        for node, mask in job.nomination.held if job.nomination is not None else ():
            if held[node] & mask:
                where = state.specs[node].name
                raise InvariantError(f"GPUs on {where} nominated to two jobs ({job.spec.id})")
            held[node] |= mask
    if held != state.held:
        raise InvariantError("held GPU bits disagree with the pending jobs' nominations")
    gpus_by_queue: dict[str, int] = {}
    for attempt in state.running.values():
        gpus_by_queue[attempt.spec.queue] = gpus_by_queue.get(attempt.spec.queue, 0) + attempt.spec.gpus
    for name, queue in state.queues.items():
        if queue.alloc_gpus != gpus_by_queue.get(name, 0):
            raise InvariantError(
                f"queue {name} counts {queue.alloc_gpus} GPUs, attempts hold {gpus_by_queue.get(name, 0)}"
            )
