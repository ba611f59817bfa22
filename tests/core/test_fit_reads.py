"""A reservation search of a gang of whole nodes is remembered while no change reaches what it
read (`fit_reads.Reads`, `reserve.READS`): every remembered answer equals a fresh search, on
random clusters through random histories (cycles that start jobs and hold and drop reservations,
ends, requeues, cordons, unhealthy and held GPUs, reservations held on top), and whole histories
decide and explain the same with that memory and without it (`test_repeats.play`,
`test_preemption_memo.busy`, the first jobs of the overload trace on a few nodes)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.core import fit_reads, reserve
from corral.core.cycle import schedule
from corral.core.decisions import CycleResult
from corral.core.model import JobId, JobSpec, NodeState, QueueName, Topology
from corral.core.placement import Request
from corral.core.request import request_for
from corral.core.state import ClusterState
from corral.policies.registry import load_policy
from corral.sim.engine import SimOptions, Simulation
from corral.sim.eventlog import EventLog
from tests.core.test_counted import wide_clusters
from tests.core.test_preemption_memo import both, busy
from tests.core.test_repeats import play
from tests.core.test_reserve_exact import clusters
from tests.core.test_whole_nodes import background


def _gangs(state: ClusterState, tag: str) -> list[JobSpec]:
    gpus = state.specs[0].gpus
    return [
        JobSpec(
            JobId(f"{tag}-{r}"),
            QueueName("q0"),
            replicas=r,
            gpus_per_replica=gpus,
            topology=Topology(None, False),
        )
        for r in range(1, 6)
    ]


def _compare(state: ClusterState, specs: list[JobSpec], now: float) -> int:
    """Each gang's remembered answer against a fresh search; how many were kept by what their
    search read (the state changed since, and no new search replaced the memory)."""
    kept = 0
    for spec in specs:
        try:
            req = request_for(state, spec)
        except ValueError:
            continue
        reads = _reads(state, req)
        found = reserve.earliest_fit(state, req, now)
        kept += reads is not None and reads is _kept(state, req)
        searched = reserve._earliest_fit(state, req, -float("inf"))
        if searched is not None and searched.start < now:
            searched = reserve.Reservation(searched.job, now, searched.capacity)
        assert found == searched
    return kept


def _reads(state: ClusterState, req: Request) -> fit_reads.Reads | None:
    """What the remembered search for these reserved GPUs read, if the state changed since."""
    key = tuple(state.reserved_at.items())
    for base, reserved, _, reads in state.fit_memo.get(req, []):
        if reserved == key and base != state.base_id and isinstance(reads, fit_reads.Reads):
            return reads
    return None


def _kept(state: ClusterState, req: Request) -> object:
    """What the remembered answer for these reserved GPUs at this base id read."""
    key = tuple(state.reserved_at.items())
    for base, reserved, _, reads in state.fit_memo.get(req, []):
        if reserved == key and base == state.base_id:
            return reads
    return None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_remembered_answers_equal_fresh_searches(data: st.DataObject) -> None:
    state = data.draw(st.one_of(clusters(), wide_clusters()))
    policy, n_nodes, gpus = load_policy("default"), len(state.specs), state.specs[0].gpus
    gangs = _gangs(state, "w")
    for step in range(8):
        now = float(step)
        action = data.draw(st.integers(0, 6))
        if action <= 1:  # a cycle: starts, and its own searches, holds and drops
            for spec in data.draw(background(len(state.queues), 10 * step)):
                try:
                    state.submit(spec)
                except ValueError:
                    continue
            schedule(state, policy, now)
        elif action == 2 and state.running:
            for job_id in data.draw(
                st.lists(st.sampled_from(sorted(state.running)), unique=True, max_size=2)
            ):
                state.end(job_id, requeue=data.draw(st.booleans()), now=now)
        elif action == 3:
            name = state.specs[data.draw(st.integers(0, n_nodes - 1))].name
            up = data.draw(st.booleans())
            state.set_node_state(name, NodeState.UP if up else NodeState.CORDONED)
        elif action == 4:
            name = state.specs[data.draw(st.integers(0, n_nodes - 1))].name
            gpu, healthy = data.draw(st.integers(0, gpus - 1)), data.draw(st.booleans())
            state.set_gpu_health(name, gpu, healthy)
        elif action == 5 and state.running:  # an end moves earlier (or later): its nodes' last ends
            job_id = data.draw(st.sampled_from(sorted(state.running)))
            state.mark_preempting(job_id, now + data.draw(st.sampled_from([0.5, 30.0, 5000.0])), None)
        _compare(state, gangs, now)
        mark = state.plan.checkpoint()  # reservations and held GPUs on top, dropped after
        for node in data.draw(st.lists(st.integers(0, n_nodes - 1), max_size=3)):
            state.set_reserved(node, state.reserved[node] + data.draw(st.integers(1, gpus)))
        if data.draw(st.booleans()):
            node = data.draw(st.integers(0, n_nodes - 1))
            state.set_held(node, state.held[node] | (1 << data.draw(st.integers(0, gpus - 1))))
        _compare(state, gangs, now)
        state.plan.rollback(mark)
        _compare(state, gangs, now)


def test_answers_are_remembered_by_reads_on_a_full_cluster() -> None:
    """A full cluster of 16 nodes whose jobs end one by one: most answers outlive the ends and
    starts (on nodes past what the search read), and equal a fresh search."""
    state, remembered = _full_cluster(16), 0
    gangs = _gangs(state, "g")
    policy = load_policy("default")
    for step in range(40):
        now = 100.0 * step
        state.end(
            sorted(state.running, key=lambda j: state.running[j].end_key or ())[0], requeue=False, now=now
        )
        schedule(state, policy, now)
        remembered += _compare(state, gangs, now)
    assert remembered >= 100  # (180 of 200 when written)


def _full_cluster(nodes: int) -> ClusterState:
    from corral.core.model import NodeName, NodeSpec, QueueSpec

    specs = [NodeSpec(NodeName(f"n{i}"), 8, "H100-80GB", labels={"leaf": f"l{i // 4}"}) for i in range(nodes)]
    state = ClusterState.build(("leaf",), specs, [QueueSpec(QueueName("q0"))])
    policy = load_policy("default")
    for i in range(nodes * 8 + 40):  # one-GPU jobs of many lengths fill every GPU, 40 wait
        spec = JobSpec(
            JobId(f"b{i}"), QueueName("q0"), gpus_per_replica=1, time_limit=600.0 + 97.0 * (i % 53)
        )
        state.submit(spec)
    schedule(state, policy, 0.0)
    return state


def _both(run: Any, *args: Any, walk: bool) -> tuple[Any, Any]:
    return both(run, *args, walk=walk, switch=(reserve, "READS"))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    policy=st.sampled_from(["default", "las", "tiresias"]),
    limits=st.sampled_from([0, 12]),
    walk=st.booleans(),
)
def test_histories_decide_as_without_reads(seed: int, policy: str, limits: int, walk: bool) -> None:
    remembered, searched = _both(play, seed, policy, limits, walk=walk)
    assert remembered == searched


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), policy=st.sampled_from(["default", "las"]), walk=st.booleans())
def test_busy_clusters_decide_as_without_reads(seed: int, policy: str, walk: bool) -> None:
    remembered, searched = _both(busy, seed, policy, walk=walk)
    assert remembered == searched


def _replay(nodes: int, jobs: int) -> tuple[list[str], int]:
    """The event log and every cycle's reasons; how often a remembered answer outlived a change
    of the state (what a search read, seen again at another base id)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    try:
        from overload_trace import overload_cluster, overload_trace
    finally:
        sys.path.pop(0)
    lines: list[str] = []
    sim = Simulation(
        overload_cluster(nodes),
        overload_trace()[:jobs],
        load_policy("default"),
        EventLog([lambda event: lines.append(repr(sorted(event.items())))]),
        SimOptions(),
    )
    bases: dict[int, int] = {}
    alive: list[object] = []  # (ids stay unique)
    kept = [0]

    def cycle(result: CycleResult) -> None:
        reasons = sorted((j, r.code.value, r.message) for j, r in result.reasons.items())
        lines.append(repr((result.now, result.next_wake, reasons)))
        for entries in sim.state.fit_memo.values():
            for base, _, _, reads in entries:
                if reads is None:
                    continue
                known = bases.get(id(reads))
                if known is None:
                    alive.append(reads)
                elif known != base:
                    kept[0] += 1
                bases[id(reads)] = base

    sim.on_cycle = cycle
    sim.run()
    return lines, kept[0]


@pytest.mark.parametrize(("nodes", "jobs"), [(8, 300), (16, 400)])
def test_overload_replays_equal_without_memory(
    nodes: int, jobs: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The overload trace's first jobs on a few nodes: the same event log with reads, with the
    memory of equal states only, and searching every time; reads kept answers."""
    with_reads, kept = _replay(nodes, jobs)
    assert kept > 0
    monkeypatch.setattr(reserve, "READS", False)
    assert _replay(nodes, jobs)[0] == with_reads
    monkeypatch.setattr(reserve, "REMEMBER", False)
    assert _replay(nodes, jobs)[0] == with_reads
