"""Reservations of concrete capacity for blocked jobs, and backfill around them (EASY).

A job blocked by capacity gets the earliest time its gang fits when running attempts end at
their time limits (or preemption deadlines): attempts are released through the plan in order
of expected end until the job places; the placement's (node, GPU count) pairs are reserved
from then on. Reserved GPUs are subtracted from what the index offers, so later jobs avoid
them unless they end (by their time limit) before every reservation they would touch.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from corral.core.model import INFINITY
from corral.core.placement import Request, place
from corral.core.state import ClusterState


@dataclass(frozen=True, slots=True)
class Reservation:
    job: str
    start: float
    capacity: tuple[tuple[int, int], ...]  # (node id, GPUs)


def earliest_fit(state: ClusterState, req: Request, now: float) -> Reservation | None:
    """When and where the gang first fits as attempts end; None if never (no time limits).

    Attempts are released in order of expected end; the gang is tried after 1, 2, 4, ... more
    releases, and once it fits, a binary search over the last stretch finds the first release
    after which it fits, so a reservation costs O(log n) placements, not one per release.
    """
    ends = state.by_end[: bisect_left(state.by_end, (INFINITY,))]  # attempts without an end last
    base = state.plan.checkpoint()
    marks: list[int] = []  # marks[i]: plan checkpoint before release i
    g = max(1, req.gpus_per_replica)

    def release_through(last: int) -> None:
        while len(marks) <= last:
            marks.append(state.plan.checkpoint())
            attempt = state.running[ends[len(marks) - 1][2]]
            for node, mask, cpus, memory in state.attempt_resources(attempt):
                state.give_back(node, mask, cpus, memory, attempt.exclusive)

    def fits_after(last: int) -> list[tuple[int, int]] | None:
        if len(marks) > last + 1:
            state.plan.rollback(marks[last + 1])
            del marks[last + 1 :]
        release_through(last)
        if state.index.capacity(0, req.classes, g)[0] < req.replicas:
            return None
        inner = state.plan.checkpoint()
        placed = place(state, req, explain=False)
        state.plan.rollback(inner)
        if not isinstance(placed, list):
            return None
        counts: dict[int, int] = {}
        for node, mask in placed:
            counts[node] = counts.get(node, 0) + mask.bit_count()
        return sorted(counts.items())

    if not ends:
        return None
    failed, step, probe = -1, 1, 0
    while True:
        found = fits_after(probe)
        if found is not None or probe == len(ends) - 1:
            break
        failed, probe, step = probe, min(probe + step, len(ends) - 1), step * 2
    if found is None:
        state.plan.rollback(base)
        return None
    lo, hi = failed, probe  # fails after lo releases (-1: none), fits after hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        result = fits_after(mid)
        if result is not None:
            hi, found = mid, result
        else:
            lo = mid
    state.plan.rollback(base)
    return Reservation("", max(ends[hi][0], now), tuple(found))


def hold(state: ClusterState, reservation: Reservation) -> None:
    """Subtract a reservation's GPUs from what the index offers (through the plan)."""
    for node, gpus in reservation.capacity:
        state.set_reserved(node, state.reserved[node] + gpus)


def lift(state: ClusterState, reservations: list[Reservation], ends_by: float) -> None:
    """Give back (through the plan) the reservations that start at or after `ends_by`."""
    for r in reservations:
        if r.start >= ends_by:
            for node, gpus in r.capacity:
                state.set_reserved(node, state.reserved[node] - gpus)


def clear(state: ClusterState, reservations: list[Reservation]) -> None:
    """Drop every reservation at the end of a cycle (they are recomputed each cycle)."""
    for r in reservations:
        for node, _ in r.capacity:
            state.reset_reserved(node)
