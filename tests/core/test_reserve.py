"""Reservations: the earliest fit found with the free-GPU count shortcut is the first release
after which the gang places, found the long way (one placement per released attempt).

The two ways are compared on when the gang fits and how many GPUs it takes, not on which equal
node: they may stop at different releases that end at the same time."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.core import reserve
from corral.core.cycle import schedule
from corral.core.model import INFINITY, NodeName, NodeSpec, QueueName, QueueSpec
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


def _buckets(state: ClusterState) -> list[object]:
    return [[list(b) for b in bl] for per in state.index.buckets for bl in per.values()]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_search_leaves_no_trace_and_its_memory_answers_as_searching_does(data: st.DataObject) -> None:
    """Over cycles with starts and ends, every reservation search answered from memory is the one
    searching again would give (start and exact nodes), and a search leaves the buckets' order
    and the state's id as they were (fails if the index kept tentative moves' order, or if an id
    survived a change)."""
    state = data.draw(clusters())
    n_queues = len(state.queues)
    policy = load_policy("default")
    for cycle in range(5):
        for spec in data.draw(jobs(n_queues, 10 * cycle)):
            state.submit(spec)
        running = sorted(state.running)
        ending = data.draw(st.lists(st.sampled_from(running), unique=True, max_size=2)) if running else []
        for job_id in ending:
            state.end(job_id, requeue=False, now=float(cycle))
        schedule(state, policy, float(cycle))
        for spec in data.draw(jobs(n_queues, 100 + 10 * cycle)):
            req = request_for(state, spec)
            before = (_buckets(state), state.base_id, len(state.plan))
            remembered = reserve.earliest_fit(state, req, float(cycle))
            assert (_buckets(state), state.base_id, len(state.plan)) == before
            searched = reserve.earliest_fit(state, req, float(cycle), remember=False)
            assert remembered == searched
            assert (_buckets(state), state.base_id, len(state.plan)) == before


def test_an_undone_change_gives_back_the_id_and_a_change_outside_the_plan_a_fresh_one() -> None:
    state = ClusterState.build((), [NodeSpec(NodeName("a"), 4, "H100-80GB")], [QueueSpec(QueueName("q"))])
    start = state.base_id
    mark = state.plan.checkpoint()
    state.take(0, 0b1, 0, 0.0, False)
    taken = state.base_id
    assert taken != start
    state.plan.rollback(mark)
    assert state.base_id == start
    state.take(0, 0b1, 0, 0.0, False)
    assert state.base_id not in (start, taken)  # ids are never given twice
    state.set_gpu_health(NodeName("a"), 3, False)  # outside the plan
    outside = state.base_id
    state.plan.rollback(mark)
    assert state.base_id not in (start, taken, outside)  # not the id of the state before the take


@dataclass(frozen=True, slots=True)
class _AsDataclass:
    """`reserve.Reservation` as the frozen dataclass it was."""

    job: str
    start: float
    capacity: tuple[tuple[int, int], ...]


_RESERVATIONS = st.tuples(
    st.sampled_from(["a", "b"]),
    st.sampled_from([0.0, 1.5, INFINITY]),
    st.lists(st.tuples(st.integers(0, 3), st.integers(1, 2)), max_size=2).map(tuple),
)


@settings(max_examples=200, deadline=None)
@given(one=_RESERVATIONS, other=_RESERVATIONS)
def test_a_reservation_is_a_value_as_its_dataclass_was(
    one: tuple[str, float, tuple[tuple[int, int], ...]],
    other: tuple[str, float, tuple[tuple[int, int], ...]],
) -> None:
    """Written out (so that the compiled core builds it natively), a `Reservation` compares,
    hashes and prints as the frozen dataclass did."""
    a, b = reserve.Reservation(*one), reserve.Reservation(*other)
    da, db = _AsDataclass(*one), _AsDataclass(*other)
    assert (a == b) == (da == db) and (a != b) == (da != db)
    assert hash(a) == hash(da) and a != da and a != one
    assert repr(a) == repr(da).replace("_AsDataclass", "Reservation")
