"""Reservations of concrete capacity for blocked jobs, and backfill around them (EASY).

A job blocked by capacity gets the earliest time its gang fits when running attempts end at
their time limits (or preemption deadlines): attempts are released through the plan in order
of expected end until the job places; the placement's (node, GPU count) pairs are reserved
from then on. Reserved GPUs are subtracted from what the index offers, so later jobs avoid
them unless they end (by their time limit) before every reservation they would touch.
"""

from __future__ import annotations

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
    """When and where the gang first fits as attempts end; None if never (no time limits)."""
    checkpoint = state.plan.checkpoint()
    index = state.index
    found: tuple[float, list[tuple[int, int]]] | None = None
    ends = state.by_end
    g = max(1, req.gpus_per_replica)
    for end, _, job_id in list(ends):
        if end == INFINITY:
            break
        attempt = state.running[job_id]
        for node, mask, cpus, memory in state.attempt_resources(attempt):
            state.give_back(node, mask, cpus, memory, attempt.exclusive)
        if index.capacity(0, req.classes, g)[0] < req.replicas:
            continue
        inner = state.plan.checkpoint()
        placed = place(state, req)
        if isinstance(placed, list):
            counts: dict[int, int] = {}
            for node, mask in placed:
                counts[node] = counts.get(node, 0) + mask.bit_count()
            found = (max(end, now), sorted(counts.items()))
            break
        state.plan.rollback(inner)
    state.plan.rollback(checkpoint)
    if found is None:
        return None
    return Reservation("", found[0], tuple(found[1]))


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
