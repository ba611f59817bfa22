"""What a waiting job is told (issue 14, defects 1 and 4): times are absolute and the cycle is due
again at them (`next_wake`); the sentence names what holds the job back (a protected victim,
a cordoned node, a required leaf, fragmentation)."""

from __future__ import annotations

from corral.core.decisions import Why
from corral.core.model import INFINITY, NodeName, NodeState
from corral.core.reasons import relative, with_relative
from tests.helpers import job, nodes, occupy, run, state_of


def test_a_victim_inside_its_min_runtime_sets_when_the_cycle_is_due_and_says_so() -> None:
    state = state_of(nodes(1, 8))
    occupy(state, "young", "n00", range(8), priority="low", now=900.0)  # low's min_runtime: 10 minutes
    state.submit(job("urgent", gpus=8, priority="urgent", submit=1000.0))
    result = run(state, 1000.0)
    assert not result.preemptions
    reason = result.reasons["urgent"]
    assert reason.message == (
        "needs 8 GPUs; 0 GPUs are free in the cluster; the jobs it may preempt are protected by "
        "min_runtime until t=1500s; no reservation: the GPUs it needs are held by jobs without a time limit"
    )
    assert reason.at == 1500.0
    assert result.next_wake == 1500.0  # nothing else may happen then: the adapter must cycle at it
    later = run(state, 1500.0)
    assert [(p.job, p.by) for p in later.preemptions] == [("young", "urgent")]


def test_a_victim_of_a_higher_class_is_no_reason_to_wake() -> None:
    state = state_of(nodes(1, 8))
    occupy(state, "peer", "n00", range(8), priority="urgent", now=900.0)
    state.submit(job("urgent", gpus=8, priority="urgent", submit=1000.0))
    result = run(state, 1000.0)
    assert "min_runtime" not in result.reasons["urgent"].message
    assert result.next_wake == INFINITY


def test_a_cordoned_node_is_named_with_its_idle_gpus() -> None:
    state = state_of(nodes(2, 8))
    occupy(state, "busy", "n00", range(8))
    state.set_node_state(NodeName("n01"), NodeState.CORDONED)
    state.submit(job("wants", gpus=8))
    reason = run(state).reasons["wants"]
    assert reason.code is Why.CAPACITY
    assert reason.message.startswith(
        "needs 8 GPUs; 0 GPUs are free in the cluster; 8 idle GPUs on nodes that take no new work: "
        "n01 (cordoned)"
    )


def test_free_gpus_scattered_over_nodes_say_so() -> None:
    state = state_of(nodes(2, 8))
    occupy(state, "a", "n00", range(4))
    occupy(state, "b", "n01", range(4))
    state.submit(job("wants", gpus=8))
    reason = run(state).reasons["wants"]
    assert reason.message.startswith("needs 8 GPUs; 8 GPUs are free in the cluster, at most 4 on one node")


def test_a_backoff_names_its_end_and_wakes_the_cycle_then() -> None:
    state = state_of(nodes(1, 8))
    pending = state.submit(job("flaky", gpus=8))
    pending.not_before = 130.0
    result = run(state, 100.0)
    reason = result.reasons["flaky"]
    assert (reason.code, reason.message, reason.at) == (
        Why.BACKOFF,
        "restart backoff: may start at t=130s",
        130.0,
    )
    assert result.next_wake == 130.0


def test_readers_see_how_far_a_time_is_after_it() -> None:
    at = 1_790_001_840.0  # 14:44:00 UTC
    text = "needs 2 x 8 GPUs; reserved to start at 14:44:00 UTC; more"
    assert (
        with_relative(text, at, at - 185)
        == "needs 2 x 8 GPUs; reserved to start at 14:44:00 UTC (in 3m); more"
    )
    assert with_relative(text, at, at + 12).endswith("14:44:00 UTC (12s ago); more")
    assert with_relative("restart backoff: may start at t=130s", 130.0, 100.0).endswith("t=130s")  # simulated
    assert relative(at, at - 3900) == "in 1h05m" and relative(at, at) == "now"


def test_a_victim_whose_protection_ends_at_a_sum_that_rounds_is_taken_at_the_wake() -> None:
    """The cycle wakes at start + min_runtime; there, (start + min_runtime) - start may round below
    min_runtime (here 599.9999999999...): the victim must be free then, or nothing wakes again."""
    start = 523_916.7
    assert (start + 600.0) - start < 600.0
    state = state_of(nodes(1, 8))
    occupy(state, "young", "n00", range(8), priority="low", now=start)
    state.submit(job("urgent", gpus=8, priority="urgent", submit=start + 10.0))
    wake = run(state, start + 10.0).next_wake
    assert wake == start + 600.0
    assert [(p.job, p.by) for p in run(state, wake).preemptions] == [("young", "urgent")]
