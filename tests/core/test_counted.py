"""Placement on counts (`core/counted.py`): where `place_counts` puts a gang, with some attempts
released only in the counts, is where releasing them in the state and placing puts it, on
random clusters (CPUs, memory, NVLink groups, cordoned nodes, unhealthy GPUs, whole-node jobs);
the counts of `ReleaseCounts` are the index's after the same releases, also after undoing some; and
the requests that counts alone cannot decide are refused."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.core import reserve
from corral.core.counted import countable, place_counts
from corral.core.cycle import schedule
from corral.core.first_release import ReleaseCounts
from corral.core.model import JobId, JobSpec, Launch, NodeName, NodeSpec, QueueName, QueueSpec
from corral.core.placement import Request, place
from corral.core.request import request_for
from corral.core.state import ClusterState
from corral.policies.registry import load_policy
from tests.core.test_properties import jobs
from tests.core.test_reserve_exact import clusters, mixed_jobs


def _placed(state: ClusterState, req: Request) -> list[tuple[int, int]] | None:
    """(node, GPUs) of `place` now, taken and rolled back."""
    mark = state.plan.checkpoint()
    placed = place(state, req, explain=False)
    state.plan.rollback(mark)
    if not isinstance(placed, list):
        return None
    counts: dict[int, int] = {}
    for node, mask in placed:
        counts[node] = counts.get(node, 0) + mask.bit_count()
    return sorted(counts.items())


def _release_in_state(state: ClusterState, job_ids: list[JobId]) -> None:
    for job_id in job_ids:
        attempt = state.running[job_id]
        for node, mask, cpus, memory in state.attempt_resources(attempt):
            state.give_back(node, mask, cpus, memory, attempt.exclusive)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_placing_on_counts_answers_as_releasing_and_placing(data: st.DataObject) -> None:
    _check_releases_and_placements(data, data.draw(clusters()), mixed_jobs)


@st.composite
def wide_clusters(draw: st.DrawFn) -> ClusterState:
    """Up to 36 nodes under up to 12 leaves of 1 to 3 nodes: more domains than nodes with room
    for a replica, and fewer, so that `place_counts` reads the domains holding such a node only
    and every domain in turn."""
    spines, leaves, gpus = draw(st.integers(1, 3)), draw(st.integers(2, 4)), draw(st.sampled_from([4, 8]))
    specs = [
        NodeSpec(
            NodeName(f"n{s}-{leaf}-{i}"), gpus, "H100-80GB", labels={"spine": f"s{s}", "leaf": f"s{s}l{leaf}"}
        )
        for s in range(spines)
        for leaf in range(leaves)
        for i in range(draw(st.integers(1, 3)))
    ]
    queues = [QueueSpec(QueueName(f"q{q}")) for q in range(draw(st.integers(1, 2)))]
    state = ClusterState.build(("spine", "leaf"), specs, queues)
    for spec in specs:
        if draw(st.integers(0, 14)) == 0:
            state.set_gpu_health(spec.name, draw(st.integers(0, gpus - 1)), healthy=False)
    return state


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_placing_on_counts_over_many_domains_answers_as_releasing_and_placing(data: st.DataObject) -> None:
    """Gangs of one to four replicas spread or packed (leaf, spine) over many small leaves."""
    _check_releases_and_placements(data, data.draw(wide_clusters()), jobs, cycles=5)


def _check_releases_and_placements(
    data: st.DataObject,
    state: ClusterState,
    draw_jobs: Callable[[int, int], st.SearchStrategy[list[JobSpec]]],
    cycles: int = 3,
) -> None:
    n_queues, policy = len(state.queues), load_policy("default")
    for cycle in range(cycles):
        for spec in data.draw(draw_jobs(n_queues, 10 * cycle)):
            try:
                state.submit(spec)
            except ValueError:
                continue
        schedule(state, policy, float(cycle))
    running = sorted(state.running)
    chosen = data.draw(st.permutations(running)) if running else []
    released = chosen[: data.draw(st.integers(0, len(chosen)))]
    undone = data.draw(st.integers(0, len(released)))
    for spec in data.draw(draw_jobs(n_queues, 100)):
        try:
            req = request_for(state, spec)
        except ValueError:
            continue
        counts = ReleaseCounts(state, req.classes)
        for job_id in released:
            counts.release(job_id)
        for _ in range(undone):
            counts.undo()
        kept = released[: len(released) - undone]
        mark = state.plan.checkpoint()
        before = list(state.index.avail)
        _release_in_state(state, kept)
        try:
            allowed = set(req.classes)
            for node, count in counts.avail.items():
                assert state.node_class[node] in allowed
                assert count == state.index.avail[node]
            for node, count in enumerate(state.index.avail):
                if node not in counts.avail and state.node_class[node] in allowed:
                    assert count == before[node]  # (an untouched node kept its count)
            expected = _placed(state, req) if countable(req) else None
        finally:
            state.plan.rollback(mark)
        if countable(req):
            assert place_counts(state, req, counts.avail) == expected


def _three_nodes() -> ClusterState:
    specs = [
        NodeSpec(NodeName(f"n{i}"), 8, "H100-80GB", cpus=8, memory_gib=64.0, labels={"leaf": "a"})
        for i in range(3)
    ]
    return ClusterState.build(("leaf",), specs, [QueueSpec(QueueName("q"))])


def test_requests_that_counts_alone_cannot_decide_are_refused() -> None:
    state = _three_nodes()
    base = JobSpec(JobId("j"), QueueName("q"), replicas=1, gpus_per_replica=2)
    assert countable(request_for(state, base))
    assert not countable(request_for(state, replace(base, cpus_per_replica=2)))
    assert not countable(request_for(state, replace(base, memory_gib_per_replica=1.0)))
    assert not countable(request_for(state, replace(base, launch=Launch.PER_NODE)))
    assert not countable(request_for(state, replace(base, gpus_per_replica=0)))
    nvlink = NodeSpec(NodeName("n0"), 8, "H100-80GB", nvlink=((0, 1, 2, 3), (4, 5, 6, 7)))
    grouped = ClusterState.build((), [nvlink], [QueueSpec(QueueName("q"))])
    assert not countable(request_for(grouped, base))  # a class with several NVLink groups


def test_counts_alone_would_place_a_gang_where_its_cpus_do_not_fit() -> None:
    """Why CPUs are refused: three nodes with 2 free GPUs each, node 0 without CPUs left; filling
    the leaf takes nodes 1 and 2, where counts alone would take nodes 0 and 1."""
    state = _three_nodes()
    state.take(0, 0b111111, 8, 0.0, False)
    state.take(1, 0b111111, 0, 0.0, False)
    state.take(2, 0b111111, 0, 0.0, False)
    spec = JobSpec(JobId("j"), QueueName("q"), replicas=2, gpus_per_replica=2, cpus_per_replica=4)
    req = request_for(state, spec)
    assert _placed(state, req) == [(1, 2), (2, 2)]
    assert place_counts(state, replace(req, cpus=0), {}) == [(0, 2), (1, 2)]
    assert not countable(req)


def _misses_lifted(state: ClusterState, req: Request, lifted: list[reserve.Reservation], bound: bool) -> bool:
    """`reserve.misses_lifted`, asked afresh (its memory emptied) with `REPLICA_BOUND` on or off."""
    was = reserve.REPLICA_BOUND
    reserve.REPLICA_BOUND = bound
    try:
        state.lift_memo = (-1, {})
        return reserve.misses_lifted(state, req, lifted, frozenset())
    finally:
        reserve.REPLICA_BOUND = was


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_miss_told_on_counts_is_the_miss_of_lifting_and_placing(data: st.DataObject) -> None:
    """`reserve.misses_lifted` (backfill) answers as lifting the reservations and placing does,
    with its count of whole replicas first (`REPLICA_BOUND`) and without."""
    state = data.draw(clusters())
    n_queues, policy = len(state.queues), load_policy("default")
    for cycle in range(3):
        for spec in data.draw(mixed_jobs(n_queues, 10 * cycle)):
            try:
                state.submit(spec)
            except ValueError:
                continue
        schedule(state, policy, float(cycle))
    held: list[reserve.Reservation] = []
    for spec in data.draw(mixed_jobs(n_queues, 100)):
        try:
            found = reserve.earliest_fit(state, request_for(state, spec), 3.0)
        except ValueError:
            continue
        if found is not None:
            found = reserve.Reservation(spec.id, found.start + data.draw(st.integers(0, 3)), found.capacity)
            reserve.hold(state, found)
            held.append(found)
    for spec in data.draw(mixed_jobs(n_queues, 200)):
        try:
            req = request_for(state, spec)
        except ValueError:
            continue
        ends_by = float(data.draw(st.integers(0, 12)))
        lifted = [r for r in held if r.start >= ends_by]
        told = _misses_lifted(state, req, lifted, data.draw(st.booleans()))
        mark = state.plan.checkpoint()
        reserve.lift(state, lifted, ends_by)
        missed = not isinstance(place(state, req, explain=False), list)
        state.plan.rollback(mark)
        assert told == (missed and countable(req))
