"""A nominated job's hold (DESIGN.md 6.3): while its victims checkpoint and stop, the GPUs it
will take are held for it. A per-node job starts alone on its nodes, so its hold covers the
whole node: no other job may start on the node's other GPUs meanwhile, or the per-node job
would start beside it (found by tests/core/test_properties_mixed.py under `las`)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from corral.core import invariants
from corral.core.model import JobId, Launch, NodeName
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
