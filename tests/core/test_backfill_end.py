"""`backfill.backfill_end` checks, at each reservation start (latest first), only the nodes that
start's reservations touch (`backfill.TOUCHED_ONLY`), not every node lifted so far: the same
answer as checking them all, on random clusters after random cycles with random reservations
held on top (starts shared by several reservations, nodes shared by several starts, reserved
GPUs beyond the free ones), and in the random histories of `test_repeats.play` and the busy
clusters of `test_preemption_memo.busy` (every decision and reason equal)."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.core import backfill, reserve
from corral.core.cycle import schedule
from corral.core.model import JobId
from corral.core.state import ClusterState
from corral.policies.registry import load_policy
from tests.core.test_counted import wide_clusters
from tests.core.test_preemption_memo import both, busy
from tests.core.test_repeats import play
from tests.core.test_reserve_exact import clusters, mixed_jobs


class _Booking:
    """What `backfill_end` reads of a cycle."""

    def __init__(self, state: ClusterState, reservations: list[reserve.Reservation]) -> None:
        self.state, self.reservations = state, reservations
        self.ends: backfill.Ends | None = None

    def epoch(self) -> tuple[int, int, bool]:
        return (0, 0, False)


def _end(state: ClusterState, reservations: list[reserve.Reservation], touched_only: bool) -> float | None:
    backfill.TOUCHED_ONLY = touched_only
    try:
        return backfill.backfill_end(_Booking(state, reservations))  # type: ignore[arg-type]
    finally:
        backfill.TOUCHED_ONLY = True


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_touched_nodes_give_the_end_of_every_lifted_node(data: st.DataObject) -> None:
    state = data.draw(st.one_of(clusters(), wide_clusters()))
    policy, n_nodes = load_policy("default"), len(state.specs)
    gpus = state.specs[0].gpus
    for cycle in range(3):
        for spec in data.draw(mixed_jobs(len(state.queues), 10 * cycle)):
            try:
                state.submit(spec)
            except ValueError:
                continue
        running = sorted(state.running)
        ending = data.draw(st.lists(st.sampled_from(running), unique=True, max_size=2)) if running else []
        for job_id in ending:
            state.end(job_id, requeue=False, now=float(cycle))
        schedule(state, policy, float(cycle))
        mark = state.plan.checkpoint()
        reservations = []
        for i in range(data.draw(st.integers(1, 6))):
            nodes = data.draw(st.lists(st.integers(0, n_nodes - 1), min_size=1, max_size=4, unique=True))
            capacity = tuple((node, data.draw(st.integers(1, gpus))) for node in sorted(nodes))
            start = float(data.draw(st.integers(cycle + 1, cycle + 4)))  # (few starts: shared)
            r = reserve.Reservation(JobId(f"r{cycle}-{i}"), start, capacity)
            reserve.hold(state, r)
            reservations.append(r)
        shortcut = _end(state, reservations, True)
        assert shortcut == _end(state, reservations, False)
        state.plan.rollback(mark)


def _both(run: Any, *args: Any, walk: bool) -> tuple[Any, Any]:
    return both(run, *args, walk=walk, switch=(backfill, "TOUCHED_ONLY"))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    policy=st.sampled_from(["default", "las", "tiresias"]),
    limits=st.sampled_from([4, 12]),
    walk=st.booleans(),
)
def test_touched_nodes_decide_as_every_lifted_node(seed: int, policy: str, limits: int, walk: bool) -> None:
    shortcut, long_way = _both(play, seed, policy, limits, walk=walk)
    assert shortcut == long_way


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), policy=st.sampled_from(["default", "las"]), walk=st.booleans())
def test_touched_nodes_on_busy_clusters(seed: int, policy: str, walk: bool) -> None:
    shortcut, long_way = _both(busy, seed, policy, walk=walk)
    assert shortcut == long_way
