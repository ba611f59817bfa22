"""Reservations: the earliest fit found with the free-GPU count shortcut is the first release
after which the gang places, found the long way (one placement per released attempt).

Which of several equal nodes a placement takes depends on the order nodes entered the index's
buckets, which releases and rollbacks change, so the two ways are compared on when the gang
fits and how many GPUs it takes, not on which equal node."""

from __future__ import annotations

from bisect import bisect_left

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.core import reserve
from corral.core.cycle import schedule
from corral.core.model import INFINITY
from corral.core.placement import Request, place
from corral.core.request import request_for
from corral.core.state import ClusterState
from corral.policies.registry import load_policy
from tests.core.test_properties import clusters, jobs


def _long_way(state: ClusterState, req: Request, now: float) -> reserve.Reservation | None:
    ends = state.by_end[: bisect_left(state.by_end, (INFINITY,))]
    base = state.plan.checkpoint()
    try:
        for end, _, job_id in ends:
            attempt = state.running[job_id]
            for node, mask, cpus, memory in state.attempt_resources(attempt):
                state.give_back(node, mask, cpus, memory, attempt.exclusive)
            inner = state.plan.checkpoint()
            placed = place(state, req, explain=False)
            state.plan.rollback(inner)
            if isinstance(placed, list):
                counts: dict[int, int] = {}
                for node, mask in placed:
                    counts[node] = counts.get(node, 0) + mask.bit_count()
                return reserve.Reservation("", max(end, now), tuple(sorted(counts.items())))
        return None
    finally:
        state.plan.rollback(base)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_the_earliest_fit_is_the_first_release_after_which_the_gang_places(data: st.DataObject) -> None:
    state = data.draw(clusters())
    n_queues = len(state.queues)
    for start in (0, 10, 20):  # fill the cluster over a few cycles
        for spec in data.draw(jobs(n_queues, start)):
            state.submit(spec)
        schedule(state, load_policy("default"), float(start))
    probes = data.draw(jobs(n_queues, 100))
    for spec in probes:
        req = request_for(state, spec)
        before = (list(state.alloc), list(state.index.avail), len(state.plan))
        fast, long = reserve.earliest_fit(state, req, 30.0), _long_way(state, req, 30.0)
        assert (fast is None) == (long is None)
        if fast is not None and long is not None:
            assert fast.start == long.start
            assert sum(c for _, c in fast.capacity) == sum(c for _, c in long.capacity) == req.gpus
        assert (list(state.alloc), list(state.index.avail), len(state.plan)) == before
