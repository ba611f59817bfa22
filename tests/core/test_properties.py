"""Hypothesis properties over random clusters and job mixes (STYLE.md 10).

No GPU in two placements; gangs all or nothing; limits respected; required packs honoured;
reservations never delayed by backfill; a preempted gang never left partly running; unhealthy
GPUs and cordoned nodes never get new work; and the fast placement is as good as a brute-force
search over every node on small clusters.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, fields

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.core.cycle import schedule
from corral.core.decisions import CycleResult
from corral.core.model import (
    JobId,
    JobSpec,
    NodeName,
    NodeSpec,
    NodeState,
    QueueName,
    QueueSpec,
    Topology,
)
from corral.core.placement import place
from corral.core.request import request_for
from corral.core.state import ClusterState
from corral.policies.registry import load_policy
from tests.helpers import check_no_double_allocation

PRIORITIES = [(0, "low"), (100, "normal"), (1000, "high"), (10000, "urgent")]


@st.composite
def clusters(draw: st.DrawFn, max_nodes: int = 10) -> ClusterState:
    spines = draw(st.integers(1, 2))
    leaves = draw(st.integers(1, 2))
    per_leaf = draw(st.integers(1, max(1, max_nodes // (spines * leaves))))
    gpus = draw(st.sampled_from([2, 4, 8]))
    split = draw(st.booleans())
    nvlink = (tuple(range(gpus // 2)), tuple(range(gpus // 2, gpus))) if split else ()
    specs = []
    for s, leaf, i in itertools.product(range(spines), range(leaves), range(per_leaf)):
        labels = {"spine": f"s{s}", "leaf": f"s{s}l{leaf}"}
        specs.append(NodeSpec(NodeName(f"n{s}{leaf}{i}"), gpus, "H100-80GB", labels=labels, nvlink=nvlink))
    total = len(specs) * gpus
    n_queues = draw(st.integers(1, 3))
    queues = []
    left = total
    for q in range(n_queues):
        quota = draw(st.integers(0, left // 2))
        left -= quota
        limit = draw(st.one_of(st.none(), st.integers(max(quota, 1), total)))
        queues.append(
            QueueSpec(QueueName(f"q{q}"), weight=draw(st.sampled_from([1.0, 2.0])), quota=quota, limit=limit)
        )
    state = ClusterState.build(("spine", "leaf"), specs, queues)
    for node in range(len(specs)):
        if draw(st.integers(0, 9)) == 0:
            state.set_node_state(specs[node].name, NodeState.CORDONED)
        if draw(st.integers(0, 9)) == 0:
            state.set_gpu_health(specs[node].name, draw(st.integers(0, gpus - 1)), healthy=False)
    return state


@dataclass
class Op:
    kind: str  # submit, cycle, end, stop
    payload: object


@st.composite
def jobs(draw: st.DrawFn, n_queues: int, start: int) -> list[JobSpec]:
    result = []
    for i in range(draw(st.integers(1, 6))):
        prio, name = draw(st.sampled_from(PRIORITIES))
        pack = draw(st.sampled_from([None, None, "node", "leaf", "spine"]))
        result.append(
            JobSpec(
                JobId(f"j{start + i}"),
                QueueName(f"q{draw(st.integers(0, n_queues - 1))}"),
                replicas=draw(st.integers(1, 4)),
                gpus_per_replica=draw(st.sampled_from([1, 1, 2, 4, 8])),
                priority=prio,
                priority_class=name,
                seq=start + i,
                time_limit=draw(st.sampled_from([None, 100.0, 500.0, 2000.0])),
                preemptible=draw(st.integers(0, 5)) > 0,
                topology=Topology(pack, draw(st.booleans()) if pack else False),
            )
        )
    return result


def check_cycle(state: ClusterState, result: CycleResult, before_running: set[str]) -> None:
    check_no_double_allocation(state)
    for start in result.starts:
        attempt = state.running[start.job]
        spec = attempt.spec
        assert len(start.placement) == spec.replicas  # all or nothing
        for replica in start.placement:
            node = state.node_ids[replica.node]
            assert len(replica.gpus) == spec.gpus_per_replica
            assert state.node_state[node] is NodeState.UP, "new work on a node that is not up"
            assert all(state.healthy[node] >> g & 1 for g in replica.gpus), "new work on an unhealthy GPU"
        if spec.topology.pack and spec.topology.required:
            ids = [state.node_ids[r.node] for r in start.placement]
            groups = len({g for n, m in attempt.placement for g in state.group_masks[n] if g & m})
            span = state.topology.span_of(ids, groups)
            assert span <= state.topology.span_index(spec.topology.pack)
    for queue in state.queues.values():
        if queue.spec.limit is not None:
            assert queue.alloc_gpus - queue.leaving_gpus <= queue.spec.limit
    for attempt in state.running.values():  # every live attempt holds all of its GPUs
        for node, mask in attempt.placement:
            assert state.alloc[node] & mask == mask
    for p in result.preemptions:
        assert p.job in before_running and state.running[p.job].preempting_deadline is not None
    check_reservations_hold(state, result)


def check_reservations_hold(state: ClusterState, result: CycleResult) -> None:
    """At each reservation's start, with attempts gone by their time limits, its GPUs are free."""
    for r in result.reservations:
        busy = [0] * len(state.specs)
        for attempt in state.running.values():
            if attempt.expected_end > r.start:
                for node, mask in attempt.placement:
                    busy[node] |= mask
        for name, count in r.capacity:
            node = state.node_ids[name]
            earlier = sum(
                c
                for other in result.reservations
                if other.start <= r.start and other is not r
                for n, c in other.capacity
                if n == name
            )
            free = (state.healthy[node] & ~busy[node] & ~state.held[node]).bit_count()
            assert free >= count + earlier, f"backfill or a start delayed the reservation of {r.job}"


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), policy=st.sampled_from(["default", "default", "fifo", "las", "tiresias"]))
def test_invariants_hold_over_random_histories(data: st.DataObject, policy: str) -> None:
    state = data.draw(clusters())
    profile = load_policy(policy)
    now, count = 0.0, 0
    for _ in range(data.draw(st.integers(1, 6))):
        for spec in data.draw(jobs(len(state.queues), count)):
            state.submit(JobSpec(**{**_fields(spec), "submit_time": now}))
            count += 1
        before = set(state.running)
        result = schedule(state, profile, now)
        check_cycle(state, result, before)
        now += data.draw(st.sampled_from([0.0, 50.0, 700.0]))
        for job_id in list(state.running):  # some attempts end, preempted victims stop
            attempt = state.running[job_id]
            stopping = attempt.preempting_deadline is not None and attempt.preempting_deadline <= now
            if stopping or attempt.limit_end <= now or data.draw(st.integers(0, 3)) == 0:
                state.end(job_id, requeue=stopping, now=now)
        check_no_double_allocation(state)


def _fields(spec: JobSpec) -> dict[str, object]:
    return {f.name: getattr(spec, f.name) for f in fields(spec)}


# ---- fast placement against brute force ------------------------------------------------------
def _quality(state: ClusterState, placed: list[tuple[int, int]]) -> tuple[int, int]:
    nodes = [n for n, _ in placed]
    groups = len({g for n, m in placed for g in state.group_masks[n] if g & m})
    return state.topology.span_of(nodes, groups), len(set(nodes))


def _brute_force(state: ClusterState, replicas: int, g: int) -> tuple[int, int] | None:
    """Best (span, nodes) over every assignment of replicas to nodes (counts per node)."""
    caps = [state.index.avail[n] // g for n in range(len(state.specs))]
    best: tuple[int, int] | None = None
    nodes = [n for n, c in enumerate(caps) if c]

    def visit(i: int, left: int, used: list[int]) -> None:
        nonlocal best
        if left == 0:
            if len(used) == 1:
                n = used[0]
                free = state.free_mask(n)
                one_group = any((free & m).bit_count() >= replicas * g for m in state.group_masks[n])
                span = 0 if one_group else 1
            else:
                span = state.topology.span_of(used, 2)
            key = (span, len(used))
            if best is None or key < best:
                best = key
            return
        if i == len(nodes):
            return
        n = nodes[i]
        for take in range(min(left, caps[n]), 0, -1):
            visit(i + 1, left - take, [*used, n])
        visit(i + 1, left, used)

    visit(0, replicas, [])
    return best


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fast_placement_is_as_good_as_brute_force(data: st.DataObject) -> None:
    state = data.draw(clusters(max_nodes=8))
    gpus = state.specs[0].gpus
    for node in range(len(state.specs)):  # random existing load
        busy = data.draw(st.integers(0, (1 << gpus) - 1))
        state.alloc[node] = busy & state.healthy[node]
        state._refresh(node)
    g = data.draw(st.sampled_from([1, 2, 4, 8]))
    replicas = data.draw(st.integers(1, 5))
    spec = JobSpec(JobId("x"), QueueName("q0"), replicas=replicas, gpus_per_replica=g)
    expected = _brute_force(state, replicas, g) if g <= gpus else None
    placed = place(state, request_for(state, spec))
    if expected is None:
        assert not isinstance(placed, list)
        return
    assert isinstance(placed, list), f"fast path found nothing, brute force found {expected}"
    assert _quality(state, placed) == expected


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_victim_selection_shortcut_never_misses_what_the_full_scan_finds(data: st.DataObject) -> None:
    from corral.core.preempt import Selection, _full_scan, select_victims

    state = data.draw(clusters())
    profile = load_policy("default")
    for spec in data.draw(jobs(len(state.queues), 0)):
        state.submit(JobSpec(**{**_fields(spec), "priority": 0, "priority_class": "low"}))
    schedule(state, profile, 0.0)
    gpus = data.draw(st.sampled_from([1, 2, 4, 8]))
    spec = JobSpec(
        JobId("urgent"),
        QueueName("q0"),
        replicas=data.draw(st.integers(1, 3)),
        gpus_per_replica=gpus,
        priority=10000,
        priority_class="urgent",
    )
    pending = state.submit(spec)
    req = request_for(state, spec)
    assert profile.victims is not None
    # reservations, as a cycle holds them while it searches victims for later jobs: what victims
    # free on such a node goes to the reservation first
    for node in range(len(state.node_ids)):
        held = data.draw(st.integers(0, 8), label=f"reserved on node {node}")
        if held:
            state.set_reserved(node, held)
    fast = select_victims(state, profile.victims, pending, req, 5000.0)
    full = _full_scan(state, profile.victims, pending, req, 5000.0)

    def has_victims(s: object) -> bool:
        return isinstance(s, Selection) and bool(s.victims)

    if any(isinstance(s, Selection) and not s.victims for s in (fast, full)):
        # the job fits without preempting anyone (either search may find that, and the full
        # scan may still rank a placement with victims first)
        assert isinstance(place(state, req, take=False), list), (fast, full)
        assert isinstance(fast, Selection), (fast, full)  # the shortcut misses no start
        return
    assert has_victims(fast) == has_victims(full), (fast, full)
    if spec.replicas == 1 and not isinstance(place(state, req, take=False), list):
        # one node freeing enough beyond its reservations: the search finds it
        victims = profile.victims
        on_node = [0] * len(state.node_ids)
        for a in state.running.values():
            if a.preempting_deadline is None and victims.eligible(pending, a, state, 5000.0):
                for node, mask in a.placement:
                    on_node[node] += mask.bit_count()
        free = [
            (state.healthy[n] & ~state.alloc[n] & ~state.held[n]).bit_count() for n in range(len(on_node))
        ]
        enough = any(
            state.is_schedulable(n)
            and state.node_class[n] in req.classes
            and free[n] - state.reserved[n] + on_node[n] >= gpus
            for n in range(len(on_node))
        )
        assert enough == isinstance(fast, Selection), (enough, fast)
    if isinstance(fast, Selection):
        ids = {v.spec.id for v in fast.victims}
        assert all(state.running[i].spec.priority < 10000 for i in ids)
