"""Reservations: the search that releases attempts in bulk (one step per node, outside the plan)
and counts placements without taking GPUs answers exactly as the search that gives each attempt
back through the plan and places and rolls back (the code before, kept here as the reference):
the same start and the same (node, GPUs), on clusters with CPUs, memory, NVLink groups,
cordoned nodes, unhealthy GPUs and whole-node (exclusive) jobs; and it leaves the state as it
found it (masks, CPUs, memory, exclusive flags, buckets, base id, plan)."""

from __future__ import annotations

import itertools
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.core import reserve
from corral.core.cycle import schedule
from corral.core.model import (
    INFINITY,
    JobId,
    JobSpec,
    Launch,
    NodeName,
    NodeSpec,
    NodeState,
    QueueName,
    QueueSpec,
)
from corral.core.placement import Request, place
from corral.core.request import request_for
from corral.core.state import ClusterState
from corral.policies.registry import load_policy
from tests.core.test_properties import jobs

Ends = Sequence[tuple[float, int, JobId]]


@st.composite
def clusters(draw: st.DrawFn) -> ClusterState:
    """Up to 12 nodes in one or two spines and leaves, with CPUs and memory."""
    spines, leaves, per_leaf = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 3))
    gpus = draw(st.sampled_from([2, 4, 8]))
    nvlink = (tuple(range(gpus // 2)), tuple(range(gpus // 2, gpus))) if draw(st.booleans()) else ()
    cpus, memory = draw(st.sampled_from([16, 32])), draw(st.sampled_from([64.0, 128.0]))
    specs = [
        NodeSpec(
            NodeName(f"n{s}{leaf}{i}"),
            gpus,
            "H100-80GB",
            cpus=cpus,
            memory_gib=memory,
            labels={"spine": f"s{s}", "leaf": f"s{s}l{leaf}"},
            nvlink=nvlink,
        )
        for s, leaf, i in itertools.product(range(spines), range(leaves), range(per_leaf))
    ]
    queues = [QueueSpec(QueueName(f"q{q}")) for q in range(draw(st.integers(1, 2)))]
    state = ClusterState.build(("spine", "leaf"), specs, queues)
    for spec in specs:
        if draw(st.integers(0, 9)) == 0:
            state.set_node_state(spec.name, NodeState.CORDONED)
        if draw(st.integers(0, 9)) == 0:
            state.set_gpu_health(spec.name, draw(st.integers(0, gpus - 1)), healthy=False)
    return state


@st.composite
def mixed_jobs(draw: st.DrawFn, n_queues: int, start: int) -> list[JobSpec]:
    """`test_properties.jobs` with CPUs, memory (exact binary fractions) and some whole-node jobs."""
    out = []
    for spec in draw(jobs(n_queues, start)):
        spec = replace(
            spec,
            cpus_per_replica=draw(st.sampled_from([0, 0, 2, 8])),
            memory_gib_per_replica=draw(st.sampled_from([0.0, 0.0, 4.5, 16.25])),
        )
        if draw(st.integers(0, 5)) == 0:
            spec = replace(spec, launch=Launch.PER_NODE)
        out.append(spec)
    return out


def _first_possible(
    state: ClusterState, req: Request, ends: Ends
) -> tuple[int | None, frozenset[int] | None]:
    """`reserve._first_possible` as it was (`available` called, no releases collected)."""
    topo, index = state.topology, state.index
    g, classes, allowed = req.gpus_per_replica, req.classes, set(req.classes)
    last = len(topo.span_names) - 1
    depth = -1 if req.max_span <= 1 else (topo.depth_of_span(req.max_span) if req.max_span < last else 0)
    if depth < 0:
        if index.best_fit(0, classes, req.gpus) >= 0:
            return 0, None
    elif any(index.capacity(dom, classes, g)[0] >= req.replicas for dom in topo.by_depth[depth]):
        return 0, None
    counts: dict[int, int] = {}
    alloc: dict[int, int] = {}
    avail: dict[int, int] = {}
    freed: set[int] = set()
    for i, (_, _, job_id) in enumerate(ends):
        attempt = state.running[job_id]
        reached: list[int] = []
        for node, mask in attempt.placement:
            if state.node_class[node] not in allowed:
                continue
            left = alloc[node] = alloc.get(node, state.alloc[node]) & ~mask
            if attempt.exclusive:
                freed.add(node)
            new = state.available(node, left, state.exclusive[node] and node not in freed)
            old = avail.get(node, index.avail[node])
            avail[node] = new
            if depth < 0:
                if new >= req.gpus:
                    reached.append(node)
                continue
            dom = topo.node_domains[node][depth]
            count = counts.get(dom)
            count = (index.capacity(dom, classes, g)[0] if count is None else count) + new // g - old // g
            counts[dom] = count
            if count >= req.replicas:
                reached.append(dom)
        if reached:
            if depth == 0:
                return i, None
            if depth < 0:
                return i, frozenset(reached)
            return i, frozenset(n for dom in reached for n in topo.domains[dom].nodes)
    return None, None


def _release(state: ClusterState, job_id: JobId) -> None:
    attempt = state.running[job_id]
    for node, mask, cpus, memory in state.attempt_resources(attempt):
        state.give_back(node, mask, cpus, memory, attempt.exclusive)


def _placed_counts(state: ClusterState, req: Request) -> tuple[tuple[int, int], ...] | None:
    inner = state.plan.checkpoint()
    placed = place(state, req, explain=False)
    state.plan.rollback(inner)
    if not isinstance(placed, list):
        return None
    counts: dict[int, int] = {}
    for node, mask in placed:
        counts[node] = counts.get(node, 0) + mask.bit_count()
    return tuple(sorted(counts.items()))


def _search(
    state: ClusterState, req: Request, now: float, ends: Ends, first: int
) -> reserve.Reservation | None:
    """Every release through the plan with a mark each; galloping then binary search."""
    base = state.plan.checkpoint()
    marks: list[int] = []

    def fits_after(last: int) -> tuple[tuple[int, int], ...] | None:
        if len(marks) > last + 1:
            state.plan.rollback(marks[last + 1])
            del marks[last + 1 :]
        while len(marks) <= last:
            marks.append(state.plan.checkpoint())
            _release(state, ends[len(marks) - 1][2])
        if state.index.capacity(0, req.classes, max(1, req.gpus_per_replica))[0] < req.replicas:
            return None
        return _placed_counts(state, req)

    failed, step, probe = first - 1, 1, first
    while True:
        found = fits_after(probe)
        if found is not None or probe == len(ends) - 1:
            break
        failed, probe, step = probe, min(probe + step, len(ends) - 1), step * 2
    if found is None:
        state.plan.rollback(base)
        return None
    lo, hi = failed, probe
    while hi - lo > 1:
        mid = (lo + hi) // 2
        result = fits_after(mid)
        if result is not None:
            hi, found = mid, result
        else:
            lo = mid
    state.plan.rollback(base)
    return reserve.Reservation("", max(ends[hi][0], now), found)


def _reference(state: ClusterState, req: Request, now: float) -> reserve.Reservation | None:
    """`reserve._earliest_fit` before the bulk releases."""
    ends = state.by_end[: bisect_left(state.by_end, (INFINITY,))]
    if not ends:
        return None
    if req.gpus_per_replica == 0:
        return _search(state, req, now, ends, 0)
    first, where = _first_possible(state, req, ends)
    if first is None:
        return None
    if req.max_span < len(state.topology.span_names) - 1 and where is not None:
        base = state.plan.checkpoint()
        for _, _, job_id in ends[: first + 1]:
            if any(node in where for node, _ in state.running[job_id].placement):
                _release(state, job_id)
        found = _placed_counts(state, req)
        state.plan.rollback(base)
        if found is not None:
            return reserve.Reservation("", max(ends[first][0], now), found)
    return _search(state, req, now, ends, first)


def _snapshot(state: ClusterState) -> object:
    buckets = [
        [list(b) for b in bl]
        for index in (state.index, state.nvl_index)
        for per in index.buckets
        for bl in per.values()
    ]
    return (
        list(state.alloc),
        list(state.free_cpus),
        list(state.free_memory),
        list(state.exclusive),
        list(state.index.avail),
        list(state.nvl_index.avail),
        buckets,
        state.base_id,
        len(state.plan),
    )


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_the_bulk_search_answers_exactly_as_releasing_one_attempt_at_a_time(data: st.DataObject) -> None:
    state = data.draw(clusters())
    n_queues, policy = len(state.queues), load_policy("default")
    for cycle in range(4):
        for spec in data.draw(mixed_jobs(n_queues, 10 * cycle)):
            try:
                state.submit(spec)
            except ValueError:
                continue  # a shape the cluster refuses (whole-node jobs asking for too much)
        running = sorted(state.running)
        for job_id in (
            data.draw(st.lists(st.sampled_from(running), unique=True, max_size=2)) if running else []
        ):
            state.end(job_id, requeue=False, now=float(cycle))
        schedule(state, policy, float(cycle))
        for spec in data.draw(mixed_jobs(n_queues, 100 + 10 * cycle)):
            try:
                req = request_for(state, spec)
            except ValueError:
                continue
            before = _snapshot(state)
            fast = reserve._earliest_fit(state, req, float(cycle))
            assert _snapshot(state) == before
            assert fast == _reference(state, req, float(cycle))
