"""The reservation search of gangs of whole nodes that may spread over the cluster
(`first_release.WholeNodes`, from the nodes in the order of their last attempts' ends) answers as
the walk over the running attempts (`first_release.first_possible`, `first_release.ReleaseCounts`):
the same first release, the same nodes at a replica's GPUs or more after every release, and the
same reservation; on random clusters after random cycles (cordoned nodes, unhealthy GPUs,
whole-node jobs, jobs without GPUs, preemptions), with random reserved and held GPUs on top."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.core import invariants, reserve
from corral.core.counted import NeedsAll, countable
from corral.core.cycle import schedule
from corral.core.first_release import ReleaseCounts, WholeNodes, first_possible
from corral.core.model import INFINITY, JobId, JobSpec, QueueName, Topology
from corral.core.request import request_for
from corral.core.state import ClusterState
from corral.policies.registry import load_policy
from tests.core.test_counted import wide_clusters
from tests.core.test_reserve_exact import clusters, mixed_jobs


@st.composite
def background(draw: st.DrawFn, n_queues: int, start: int) -> list[JobSpec]:
    """`mixed_jobs`, some of them without GPUs (attempts on a node that leave its GPUs free)."""
    return [
        replace(spec, gpus_per_replica=0) if draw(st.integers(0, 6)) == 0 else spec
        for spec in draw(mixed_jobs(n_queues, start))
    ]


def _compare(state: ClusterState, spec: JobSpec, now: float) -> bool:
    """Compare the two searches for this gang; whether `WholeNodes` applied."""
    try:
        req = request_for(state, spec)
    except ValueError:
        return False
    if not countable(req) or not WholeNodes.applies(state, req):
        return False
    ends = state.by_end[: bisect_left(state.by_end, (INFINITY,))]
    nodes = WholeNodes(state, req, ends)
    try:
        first = nodes.first()
        walked = first_possible(state, req, ends, False)[0] if ends else None
        assert first == walked or (not ends and first in (0, None))
        counts = ReleaseCounts(state, req.classes)
        g, base = req.gpus_per_replica, state.index.avail
        for i, (_, _, job_id) in enumerate(ends):
            counts.release(job_id)
            long_way = {n: a for n, a in counts.avail.items() if a >= g and base[n] < g}
            assert nodes.avail(i) == long_way
    except NeedsAll:
        pass  # (a node with two whole-node attempts: the search walks)
    reserve.WHOLE_NODES = False
    try:
        walk = reserve._earliest_fit(state, req, now)
    finally:
        reserve.WHOLE_NODES = True
    assert reserve._earliest_fit(state, req, now) == walk
    return True


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_whole_nodes_answer_as_the_walk_over_the_attempts(data: st.DataObject) -> None:
    state = data.draw(st.one_of(clusters(), wide_clusters()))
    n_queues, policy = len(state.queues), load_policy("default")
    gpus = state.specs[0].gpus
    applied = 0
    for cycle in range(4):
        for spec in data.draw(background(n_queues, 10 * cycle)):
            try:
                state.submit(spec)
            except ValueError:
                continue
        running = sorted(state.running)
        ending = data.draw(st.lists(st.sampled_from(running), unique=True, max_size=2)) if running else []
        for job_id in ending:
            state.end(job_id, requeue=data.draw(st.booleans()), now=float(cycle))
        schedule(state, policy, float(cycle))
        invariants.check(state)  # (the nodes' attempt ends follow the attempts)
        mark = state.plan.checkpoint()
        for node in data.draw(st.lists(st.integers(0, len(state.specs) - 1), max_size=3)):
            state.set_reserved(node, state.reserved[node] + data.draw(st.integers(1, gpus)))
        for node in data.draw(st.lists(st.integers(0, len(state.specs) - 1), max_size=2)):
            state.set_held(node, state.held[node] | (1 << data.draw(st.integers(0, gpus - 1))))
        for replicas in range(1, 6):
            spec = JobSpec(
                JobId(f"w{cycle}-{replicas}"),
                QueueName("q0"),
                replicas=replicas,
                gpus_per_replica=gpus,
                topology=Topology(None, False),
            )
            applied += _compare(state, spec, float(cycle))
        state.plan.rollback(mark)
    assert applied or any(spec.nvlink for spec in state.specs)  # (NVLink groups: not countable)
