"""Victim selection beside the cycle's reservations (issue 16).

A reservation holds a *count* of a node's GPUs, not which ones, and the index shows a node whose
reservations exceed its free GPUs as having none available (never fewer). Victims freed on such a
node give the preemptor only what they free beyond the reservations' excess (`reserved_short`),
and of the victims there the placement does not touch, those whose GPUs the count needs stay
victims (`kept_for_reservations`). Without this a reserved node looked freeable, was chosen, and
the placement failed: the job waited for an unrelated event (`bench/quota_guarantee.py`).
"""

from __future__ import annotations

from corral.core.jobs import RunningAttempt
from corral.core.state import ClusterState


def reserved_short(state: ClusterState) -> dict[int, int]:
    """Per node, the GPUs the cycle's reservations hold there beyond its free GPUs (the index
    counts such a node as having none available): GPUs its victims free go to the reservation
    first, so only what they free beyond this counts for the preemptor. Without this, a node a
    reservation holds looked freeable, was chosen, the placement failed, and the job waited for
    an unrelated event (`bench/quota_guarantee.py`: 685 s below quota with GPUs lent)."""
    if not state.reserved_at:
        return {}
    healthy, alloc, held, reserved = state.healthy, state.alloc, state.held, state.reserved
    short: dict[int, int] = {}
    for node in state.reserved_at:
        over = reserved[node] - (healthy[node] & ~alloc[node] & ~held[node]).bit_count()
        if over > 0:
            short[node] = over
    return short


def kept_for_reservations(
    state: ClusterState, victims: list[RunningAttempt], kept: list[RunningAttempt], used: dict[int, int]
) -> set[int]:
    """Reservations hold a count of a node's GPUs, not which ones: on a node of the placement where
    they hold more than its free GPUs less the job's, keep (in victim order) the victims there that
    the placement does not touch until the count is covered (else a victim freeing the GPUs the
    reservation takes would be dropped, and the job would wait on GPUs that never come free). The
    ids of the victims to keep beyond `kept`."""
    reserved, healthy, alloc, held = state.reserved, state.healthy, state.alloc, state.held
    taken = {id(a) for a in kept}
    more: set[int] = set()
    for node, mask in used.items():
        if not reserved[node]:
            continue
        free = (healthy[node] & ~alloc[node] & ~held[node]).bit_count()
        missing = mask.bit_count() + reserved[node] - free
        for a in kept:
            missing -= sum(m.bit_count() for n, m in a.placement if n == node)
        for a in victims:
            if missing <= 0:
                break
            if id(a) not in taken and id(a) not in more:
                on = sum(m.bit_count() for n, m in a.placement if n == node)
                if on:
                    more.add(id(a))
                    missing -= on
    return more
