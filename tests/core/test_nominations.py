"""A nominated job's hold (DESIGN.md 6.3): while its victims checkpoint and stop, the GPUs it
will take are held for it. A per-node job starts alone on its nodes, so its hold covers the
whole node: no other job may start on the node's other GPUs meanwhile, or the per-node job
would start beside it (found by tests/core/test_properties_mixed.py under `las`)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from corral.core import invariants
from corral.core.model import JobId, Launch, NodeName, QueueName, QueueSpec
from tests.helpers import job, nodes, occupy, run, state_of


@pytest.mark.parametrize("policy", ["default", "las"])
def test_a_per_node_nominee_holds_its_whole_node_until_it_starts(policy: str) -> None:
    state = state_of(nodes(1, 8))
    occupy(state, "low", "n00", range(4), priority="low", now=0.0)  # half the node, preemptible
    urgent = replace(job("urgent", gpus=4, priority="high", submit=1000.0), launch=Launch.PER_NODE)
    state.submit(urgent)
    result = run(state, 1000.0, policy)  # past low's minimum run time
    assert [(p.job, p.by) for p in result.preemptions] == [("low", "urgent")]
    assert [n.job for n in result.nominations] == ["urgent"]
    invariants.check(state)

    # while `low` checkpoints (its grace), one-GPU work arrives: the node's free half is held
    for i in range(4):
        state.submit(job(f"small{i}", submit=1001.0))
    result = run(state, 1001.0, policy)
    assert result.starts == [], [s.job for s in result.starts]
    invariants.check(state)

    state.end(JobId("low"), requeue=True, now=1010.0)
    result = run(state, 1010.0, policy)
    assert [s.job for s in result.starts] == ["urgent"]  # alone on n00
    assert list(state.running) == [JobId("urgent")]
    invariants.check(state)


def test_a_per_node_job_preempts_every_attempt_on_the_node_it_takes() -> None:
    """Its victims are every attempt on its node, not only enough for its GPU count; a node with
    an attempt that may not be taken (not preemptible) is no candidate."""
    state = state_of(nodes(2, 8))
    occupy(state, "a", "n00", range(4), priority="low", now=0.0)
    pinned = state.submit(job("b", gpus=2, priority="low", preemptible=False))  # may not be taken
    state.unchecked.remove(pinned)
    state.remove_pending(JobId("b"))
    state.start(pinned, [(state.node_ids[NodeName("n00")], 0b110000)], 0.0)
    state.plan.commit()
    occupy(state, "c", "n01", [0, 1], priority="low", now=0.0)
    occupy(state, "d", "n01", [2, 3], priority="low", now=0.0)
    state.submit(replace(job("urgent", gpus=4, priority="high", submit=1000.0), launch=Launch.PER_NODE))
    result = run(state, 1000.0)
    assert sorted(p.job for p in result.preemptions) == ["c", "d"]
    assert [(n.job, [r.node for r in n.placement]) for n in result.nominations] == [("urgent", ["n01"])]
    invariants.check(state)


def test_a_nomination_moves_a_reservation_that_counted_on_its_gpus() -> None:
    """q1's head reserves the GPU that `low` frees at its time limit (100 s); later in the same
    cycle a normal-class job of q0 preempts `low` and is nominated to that node, which it will
    hold with no time limit. The reservation may not stay there: it is searched again with the
    nomination held (found by tests/core/test_properties_mixed.py)."""
    from corral.core.cycle import schedule
    from corral.core.model import JobSpec, NodeSpec, PriorityClass, QueueName, QueueSpec
    from corral.core.state import ClusterState
    from corral.policies.registry import load_policy
    from tests.core.test_properties import check_reservations_hold

    labels = {"spine": "s0", "leaf": "l0"}
    two = [NodeSpec(NodeName(f"n{i}"), 2, "H100-80GB", labels=labels) for i in range(2)]
    queues = [QueueSpec(QueueName("q0"), quota=2), QueueSpec(QueueName("q1"), quota=0)]
    classes = [PriorityClass("low", 0, 0.0), PriorityClass("normal", 100, 0.0)]
    state = ClusterState.build(("spine", "leaf"), two, queues, classes)
    low, normal = {"priority": 0, "priority_class": "low"}, {"priority": 100, "priority_class": "normal"}

    def spec(i: int, queue: str, at: float, **kw: object) -> JobSpec:
        one = {"replicas": 1, "gpus_per_replica": 1, "seq": i, "submit_time": at}
        return JobSpec(JobId(f"j{i}"), QueueName(queue), **one, **kw)  # type: ignore[arg-type]

    policy = load_policy("default")
    state.submit(spec(0, "q0", 0.0, time_limit=100.0, **low))
    state.submit(spec(2, "q0", 0.0, preemptible=False, launch=Launch.PER_NODE, **normal))
    assert len(schedule(state, policy, 0.0).starts) == 2  # the cluster is full from here on
    state.submit(spec(3, "q0", 50.0, preemptible=False, launch=Launch.PER_NODE, **normal))
    state.submit(spec(4, "q1", 50.0, launch=Launch.PER_NODE, **low))
    result = schedule(state, policy, 50.0)
    assert [(p.job, p.by) for p in result.preemptions] == [("j0", "j3")]
    check_reservations_hold(state, result)
    # both nodes are held by jobs without a time limit now: no reservation, and the reason says so
    assert result.reservations == []
    reason = result.reason_of(JobId("j4"))
    assert reason is not None and "no reservation" in reason.message, reason
    invariants.check(state)


def test_a_victim_that_starts_again_before_its_preemptor_no_longer_holds_it_back() -> None:
    """A victim stops and, in the next cycle, starts again elsewhere before its preemptor is looked
    at: the preemptor waited for that new attempt to end (10,166 s on the overload trace under
    `tiresias`, `bench/quota_guarantee.py`), as if it were still the victim. It starts now."""
    qs = [QueueSpec(QueueName("a"), quota=8, cohort="lab"), QueueSpec(QueueName("b"), quota=8, cohort="lab")]
    state = state_of(nodes(2, 8), qs)
    occupy(state, "a1", "n00", range(4), queue="a", now=0.0)
    occupy(state, "a2", "n00", range(4, 8), queue="a", now=0.0)
    occupy(state, "a3", "n01", range(4), queue="a", now=100.0)  # a borrows 4 GPUs: a3 frees n01
    state.submit(job("nb", "b", gpus=8, submit=900.0))
    result = run(state, 1000.0)
    assert [(p.job, p.by) for p in result.preemptions] == [("a3", "nb")]
    state.end(JobId("a3"), requeue=True, now=1030.0)  # its grace is over: it stopped
    state.end(JobId("a1"), requeue=False, now=1030.0)  # and a1 ended: a3 fits on n00 again
    result = run(state, 1030.0)
    assert sorted(s.job for s in result.starts) == ["a3", "nb"]
    assert state.running[JobId("a3")].attempt == 2
    invariants.check(state)
