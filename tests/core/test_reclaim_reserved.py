"""Victim selection beside the cycle's reservations: GPUs freed on a node that a reservation holds
count only beyond what the reservation takes of them (the quota's promise, issue 16)."""

from __future__ import annotations

from corral.core.model import QueueName, QueueSpec
from corral.core.state import ClusterState
from tests.helpers import job, nodes, occupy, run, state_of


def reserved_borrowers() -> ClusterState:
    """a (quota 16) runs 4 GPUs; b (quota 16) borrows 24: b1 on n00 and b2 on n01 end by their time
    limits (so a reservation counts on them), b3 on n03 has none. b1 started last: it loses the
    least work, so n00 is the node cheapest to free."""
    qs = [QueueSpec(QueueName(q), quota=16, cohort="lab") for q in ("a", "b")]
    state = state_of(nodes(4, 8), qs)
    occupy(state, "b3", "n03", range(8), queue="b", now=0.0)
    occupy(state, "b2", "n01", range(8), queue="b", now=100.0, time_limit=10_000.0)
    occupy(state, "b1", "n00", range(8), queue="b", now=200.0, time_limit=10_000.0)
    occupy(state, "a1", "n02", range(4), queue="a", now=300.0)
    return state


def test_a_job_within_its_quota_reclaims_a_node_no_reservation_holds() -> None:
    """a's 16-GPU gang would take a above its quota: it may not reclaim, and reserves n00 and n01
    (where b1 and b2 end by their limits). a's 8-GPU job, within the quota, reclaims: not on n00 or
    n01, whose freed GPUs the reservation takes, but on n03. Before the fix the aggregates counted
    n00 (cheapest) as freeable to 8 GPUs, placing there failed, and the job waited for unrelated
    events (685 s on the overload trace, `bench/quota_guarantee.py`)."""
    state = reserved_borrowers()
    state.submit(job("big", "a", gpus=8, replicas=2, submit=500.0))
    state.submit(job("small", "a", gpus=8, submit=600.0))
    result = run(state, 1000.0)
    assert [r.job for r in result.reservations] == ["big"]
    assert [(p.job, p.by) for p in result.preemptions] == [("b3", "small")]
    assert [n.job for n in result.nominations] == ["small"]
